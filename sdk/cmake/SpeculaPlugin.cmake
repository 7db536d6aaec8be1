# specula_add_plugin(NAME SOURCES src...) builds a Specula plugin: a MODULE library named
# libspecula-NAME.so that exports only its entry symbol and links the SDK statically.
include_guard(GLOBAL)
function(specula_add_plugin name)
  cmake_parse_arguments(ARG "" "" "SOURCES" ${ARGN})
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "specula_add_plugin(${name}): SOURCES is required")
  endif()
  add_library(${name} MODULE ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE Specula::sdk)
  target_compile_features(${name} PRIVATE cxx_std_20)
  set_target_properties(${name} PROPERTIES
    PREFIX "libspecula-"
    OUTPUT_NAME ${name}
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  # --no-undefined: a missing symbol fails the build, not the load. --exclude-libs: the statically linked
  # SDK stays private, so the entry symbol is the only export and plugins never interpose each other.
  target_link_options(${name} PRIVATE -Wl,--no-undefined -Wl,--exclude-libs,ALL)
  if(DEFINED SPECULA_PLUGIN_BUILD_DIR)
    set_target_properties(${name} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${SPECULA_PLUGIN_BUILD_DIR})
  endif()
  if(DEFINED SPECULA_PLUGIN_INSTALL_DIR)
    install(TARGETS ${name} LIBRARY DESTINATION ${SPECULA_PLUGIN_INSTALL_DIR} COMPONENT plugins)
  endif()
endfunction()
