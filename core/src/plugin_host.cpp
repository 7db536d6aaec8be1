#include "specula/core/plugin_host.hpp"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <set>
#include <sstream>
#include <system_error>
#include <tuple>
#include <type_traits>

#include <boost/dll/shared_library.hpp>

#include "specula/core/model_ref.hpp"
#include "specula/core/version.hpp"
#include "specula/error.hpp"
#include "specula/log.hpp"

namespace fs = std::filesystem;

namespace specula::core {

bool PluginInfo::has_kind(std::string_view kind) const {
  return std::find(kinds.begin(), kinds.end(), kind) != kinds.end();
}

struct PluginHost::Library {
  boost::dll::shared_library lib;
};

struct PluginHost::Entry {
  PluginInfo info;
  std::shared_ptr<Library> library;
  const PluginFactories* factories = nullptr;
};

namespace {

// ---------------------------------------------------------------------------------------------------
// The plugin kinds: one row each, the only place the host spells a kind out. A descriptor's kinds are
// checked against the names and each declared kind's factory must be set; make<K> makes any kind's
// objects (the schema check when the kind has a schema, the factory, the pinning); find_accepting<K>
// finds the plugin of a kind whose objects say whether they accept a file.

// How the host picks the plugin of a kind when none is named.
enum class FoundBy {
  Name,  // by name only: backend, sampler, lm_head, attention
  Path,  // the first format whose can_open accepts the path (open_model)
  File,  // the first plugin whose object accepts the opened file (find_accepting<K>: model, drafter, converter)
};

// How a "no ... plugin accepts" message names the file's architecture.
std::string quoted_architecture(const ModelFile& file) {
  const std::string arch = file.architecture();
  return fmt::format("'{}'", arch.empty() ? "not declared" : arch);
}
// A Hugging Face checkpoint's config.json architectures too (what a converter reads).
std::string config_architecture(const ModelFile& file) {
  const std::string arch = file.architecture();
  const auto& md = file.metadata();
  if (auto c = md.find("config"); c != md.end() && c->is_object() && c->contains("architectures"))
    return fmt::format("architectures {}, model_type '{}'", (*c)["architectures"].dump(), arch);
  return arch.empty() ? "not declared" : fmt::format("'{}'", arch);
}

template <typename Factory>
struct PluginKind {
  std::string_view name;                                    // as SpeculaPluginDescriptor::kinds spells it
  Factory PluginFactories::*factory;                        // what makes its objects
  const OptionSchema* PluginFactories::*options = nullptr;  // its option schema; null: it takes no options
  FoundBy found_by = FoundBy::Name;
  std::string (*architecture_of)(const ModelFile&) = nullptr;  // FoundBy::File: for the message
};
// Clang 14 (the fuzz build) does not deduce an aggregate's template arguments by itself.
template <typename Factory, typename... Rest>
PluginKind(std::string_view, Factory PluginFactories::*, Rest...) -> PluginKind<Factory>;

constexpr PluginKind kFormat{"format", &PluginFactories::format, nullptr, FoundBy::Path};
constexpr PluginKind kBackend{"backend", &PluginFactories::backend, &PluginFactories::backend_options};
constexpr PluginKind kModel{"model", &PluginFactories::model, &PluginFactories::model_options, FoundBy::File,
                            &quoted_architecture};
constexpr PluginKind kDrafter{"drafter", &PluginFactories::drafter, &PluginFactories::drafter_options, FoundBy::File,
                              &quoted_architecture};
constexpr PluginKind kSampler{"sampler", &PluginFactories::sampler, &PluginFactories::sampler_options};
constexpr PluginKind kConverter{"converter", &PluginFactories::converter, nullptr, FoundBy::File, &config_architecture};
constexpr PluginKind kLmHead{"lm_head", &PluginFactories::lm_head, &PluginFactories::lm_head_options};
constexpr PluginKind kAttention{"attention", &PluginFactories::attention, &PluginFactories::attention_options};
// Every kind, in the order messages list them.
constexpr std::tuple kKinds{kFormat, kBackend, kModel, kDrafter, kSampler, kConverter, kLmHead, kAttention};

// Calls fn(kind) for the row named `name`; false when no kind has that name.
template <typename Fn>
bool visit_kind(std::string_view name, Fn&& fn) {
  return std::apply([&](const auto&... k) { return ((k.name == name && (fn(k), true)) || ...); }, kKinds);
}

std::string kind_names() {
  std::string out;
  std::apply([&](const auto&... k) { ((out += (out.empty() ? "" : ", ") + std::string(k.name)), ...); }, kKinds);
  return out;
}

// Accepted libraries stay loaded for the life of the process even when every object and host is gone:
// plugins may leave thread-locals, atexit handlers or objects created by plugin code (contexts,
// tokenizers) behind, and dlclose under them crashes (the policy of ggml and ONNX Runtime as well).
void keep_loaded_forever(std::shared_ptr<void> library) {
  static std::mutex mutex;
  static auto* keep = new std::vector<std::shared_ptr<void>>();  // intentionally never destroyed
  std::lock_guard lock(mutex);
  keep->push_back(std::move(library));
}

// The log sink lent to plugins: their messages go through the host's logging (and its sink).
void host_log_sink(LogLevel level, const char* message) { log_message(level, message ? message : ""); }

std::vector<std::string> split(std::string_view text, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(sep, start);
    if (end == std::string_view::npos) end = text.size();
    std::string part(text.substr(start, end - start));
    part.erase(0, part.find_first_not_of(" \t"));
    part.erase(part.find_last_not_of(" \t") + 1);
    if (!part.empty()) out.push_back(part);
    start = end + 1;
  }
  return out;
}

// Boost.DLL folds dlerror() into its exception text; keep only the system's own message.
std::string load_error_reason(const std::exception& e) {
  std::string what = e.what();
  const std::string marker = "(dlerror system message: ";
  size_t at = what.find(marker);
  if (at == std::string::npos) return what;
  size_t start = at + marker.size();
  size_t end = what.rfind(')');
  if (end == std::string::npos || end < start) end = what.size();
  return what.substr(start, end - start);
}

template <typename T>
std::shared_ptr<T> pinned(std::unique_ptr<T> object, std::shared_ptr<void> library) {
  // The deleter owns a reference to the library, so the plugin's code (the object's destructor)
  // is still mapped when the object is destroyed.
  T* raw = object.release();
  return std::shared_ptr<T>(raw, [library = std::move(library)](T* p) { delete p; });
}

template <typename T>
std::shared_ptr<T> pinned(std::shared_ptr<T> object, std::shared_ptr<void> library) {
  struct Holder {
    std::shared_ptr<void> library;  // destroyed last
    std::shared_ptr<T> object;
  };
  auto holder = std::make_shared<Holder>(Holder{std::move(library), std::move(object)});
  T* raw = holder->object.get();
  return std::shared_ptr<T>(holder, raw);
}

// Model and drafter loaders hand out further plugin objects; these proxies pin the library to them too.
class PinnedModelLoader final : public ModelLoader {
 public:
  PinnedModelLoader(std::shared_ptr<ModelLoader> inner, std::shared_ptr<void> library)
      : inner_(std::move(inner)), library_(std::move(library)) {}
  std::string architecture() const override { return inner_->architecture(); }
  bool accepts(const ModelFile& file) const override { return inner_->accepts(file); }
  ModelInfo check(const ModelFile& file, const ComputeBackend& backend, const nlohmann::json& options) const override {
    return inner_->check(file, backend, options);
  }
  std::shared_ptr<Model> load(std::shared_ptr<const ModelFile> file, std::shared_ptr<ComputeBackend> backend,
                              const nlohmann::json& options, const ModelParts& parts) const override {
    return pinned(inner_->load(std::move(file), std::move(backend), options, parts), library_);
  }

 private:
  std::shared_ptr<ModelLoader> inner_;
  std::shared_ptr<void> library_;
};

class PinnedDrafterLoader final : public DrafterLoader {
 public:
  PinnedDrafterLoader(std::shared_ptr<DrafterLoader> inner, std::shared_ptr<void> library)
      : inner_(std::move(inner)), library_(std::move(library)) {}
  std::string architecture() const override { return inner_->architecture(); }
  bool accepts(const ModelFile& file) const override { return inner_->accepts(file); }
  void check(const ModelFile& file, const ComputeBackend& backend, const ModelInfo& target,
             const nlohmann::json& options) const override {
    inner_->check(file, backend, target, options);
  }
  std::shared_ptr<Drafter> load(std::shared_ptr<const ModelFile> file, std::shared_ptr<ComputeBackend> backend,
                                const ModelInfo& target, const nlohmann::json& options,
                                const ModelParts& parts) const override {
    return pinned(inner_->load(std::move(file), std::move(backend), target, options, parts), library_);
  }

 private:
  std::shared_ptr<DrafterLoader> inner_;
  std::shared_ptr<void> library_;
};

// A format plugin's ModelFile is pinned the same way.
class PinnedFormat final : public ModelFormat {
 public:
  PinnedFormat(std::shared_ptr<ModelFormat> inner, std::shared_ptr<void> library)
      : inner_(std::move(inner)), library_(std::move(library)) {}
  std::string name() const override { return inner_->name(); }
  bool can_open(const fs::path& path) const override { return inner_->can_open(path); }
  std::unique_ptr<ModelFile> open(const fs::path& path) const override { return inner_->open(path); }
  bool can_write() const override { return inner_->can_write(); }
  void write(const fs::path& path, const gguf::Metadata& metadata, const std::vector<TensorSpec>& tensors) const override {
    inner_->write(path, metadata, tensors);
  }
  std::shared_ptr<ModelFile> open_pinned(const fs::path& path) const {
    return pinned(std::shared_ptr<ModelFile>(inner_->open(path)), library_);
  }

 private:
  std::shared_ptr<ModelFormat> inner_;
  std::shared_ptr<void> library_;
};

// What the host hands out for a factory's object: pinned to its library; formats and loaders wrapped so
// that the files, models and drafters they create pin it too.
template <typename T>
std::shared_ptr<T> for_host(std::unique_ptr<T> made, const std::shared_ptr<void>& library) {
  return pinned(std::move(made), library);
}
std::shared_ptr<ModelFormat> for_host(std::unique_ptr<ModelFormat> made, const std::shared_ptr<void>& library) {
  return std::make_shared<PinnedFormat>(pinned(std::move(made), library), library);
}
std::shared_ptr<ModelLoader> for_host(std::unique_ptr<ModelLoader> made, const std::shared_ptr<void>& library) {
  return std::make_shared<PinnedModelLoader>(pinned(std::move(made), library), library);
}
std::shared_ptr<DrafterLoader> for_host(std::unique_ptr<DrafterLoader> made, const std::shared_ptr<void>& library) {
  return std::make_shared<PinnedDrafterLoader>(pinned(std::move(made), library), library);
}

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += sep;
    out += parts[i];
  }
  return out;
}

}  // namespace

std::vector<fs::path> plugin_search_path(const std::vector<fs::path>& first) {
  std::vector<fs::path> dirs = first;
  if (const char* env = std::getenv("SPECULA_PLUGIN_PATH")) {
    for (const auto& d : split(env, ':')) dirs.emplace_back(d);
  }
  dirs.emplace_back(SPECULA_PLUGIN_BUILD_DIR);
  dirs.emplace_back(SPECULA_PLUGIN_INSTALL_DIR);
  return dirs;
}

PluginHost::PluginHost() = default;
PluginHost::~PluginHost() = default;

void PluginHost::discover(const std::vector<fs::path>& dirs) {
  std::set<fs::path> seen_dirs;
  for (const auto& dir : dirs) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) {
      log_debug("plugin directory {} does not exist; skipped", dir.string());
      continue;
    }
    fs::path canonical = fs::weakly_canonical(dir, ec);
    if (!seen_dirs.insert(ec ? dir : canonical).second) continue;  // the same directory listed twice
    std::vector<fs::path> files;
    for (const auto& item : fs::directory_iterator(dir, ec)) {
      if (item.path().extension() == ".so" && !item.is_directory()) files.push_back(item.path());
    }
    std::sort(files.begin(), files.end());
    log_debug("scanning {} for plugins: {} candidate(s)", dir.string(), files.size());
    for (const auto& f : files) add_library(f);
  }
}

bool PluginHost::add_library(const fs::path& file) {
  std::error_code ec;
  fs::path canonical = fs::weakly_canonical(file, ec);
  if (ec) canonical = file;
  for (const auto& e : entries_) {
    std::error_code ec2;
    if (fs::equivalent(e.info.file, canonical, ec2)) return true;  // already loaded from this very file
  }
  auto reject = [&](std::string reason) {
    log_debug("plugin rejected: {}", reason);
    rejected_.push_back({canonical, std::move(reason)});
    return false;
  };
  const std::string where = canonical.string();

  auto library = std::make_shared<Library>();
  try {
    library->lib.load(boost::dll::fs::path(canonical.string()),
                      boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  } catch (const std::exception& e) {
    return reject(fmt::format("{}: cannot be loaded as a shared library: {}", where, load_error_reason(e)));
  }
  if (!library->lib.has(SPECULA_PLUGIN_ENTRY_SYMBOL)) {
    return reject(fmt::format("{}: not a Specula plugin: it does not export the entry symbol '{}'", where,
                              SPECULA_PLUGIN_ENTRY_SYMBOL));
  }
  using EntryFn = const SpeculaPluginDescriptor*();
  const SpeculaPluginDescriptor* d = library->lib.get<EntryFn>(SPECULA_PLUGIN_ENTRY_SYMBOL)();
  if (!d) return reject(fmt::format("{}: its entry symbol '{}' returned no descriptor", where, SPECULA_PLUGIN_ENTRY_SYMBOL));

  // The two checks that must pass before any C++ object is touched.
  if (d->abi_version != SPECULA_PLUGIN_ABI_VERSION) {
    return reject(fmt::format(
        "{}: built for plugin ABI version {}, but this specula {} uses plugin ABI version {}; rebuild the "
        "plugin against the Specula {} SDK",
        where, d->abi_version, core::version(), SPECULA_PLUGIN_ABI_VERSION, core::version()));
  }
  const std::string fingerprint = d->fingerprint ? d->fingerprint : "(none)";
  if (fingerprint != SPECULA_ABI_FINGERPRINT) {
    return reject(fmt::format(
        "{}: built with ABI fingerprint '{}', but this specula was built with '{}' (compiler, standard "
        "library, C++ standard and the SDK interface hash must match); rebuild the plugin with the same "
        "toolchain against this Specula's SDK",
        where, fingerprint, SPECULA_ABI_FINGERPRINT));
  }
  if (!d->name || !*d->name) return reject(fmt::format("{}: its descriptor has an empty plugin name", where));
  if (!d->kinds || !d->version || !d->attach || !d->factories) {
    return reject(fmt::format("{}: its descriptor for plugin '{}' is incomplete (kinds, version, attach and "
                              "factories are required)", where, d->name));
  }

  PluginInfo info;
  info.name = d->name;
  info.kinds = split(d->kinds, ',');
  info.version = d->version;
  info.description = d->description ? d->description : "";
  info.file = canonical;
  if (info.kinds.empty()) return reject(fmt::format("{}: plugin '{}' declares no kind", where, info.name));
  for (const auto& k : info.kinds) {
    if (!visit_kind(k, [](const auto&) {}))
      return reject(fmt::format("{}: plugin '{}' declares unknown kind '{}' (expected one of {})", where, info.name, k,
                                kind_names()));
  }
  if (const PluginInfo* first = find(info.name)) {
    return reject(fmt::format("{}: plugin '{}' {} is shadowed by plugin '{}' {} from {}, found earlier in the "
                              "search path", where, info.name, info.version, first->name, first->version,
                              first->file.string()));
  }

  HostServices services;
  services.log_sink = &host_log_sink;
  services.log_level = log_level();
  d->attach(&services);
  const PluginFactories* factories = d->factories();
  if (!factories) return reject(fmt::format("{}: plugin '{}' returned no factories", where, info.name));
  for (const auto& k : info.kinds) {
    bool provided = false;
    visit_kind(k, [&](const auto& kind) { provided = factories->*kind.factory != nullptr; });
    if (!provided)
      return reject(fmt::format("{}: plugin '{}' declares kind '{}' but has no {} factory", where, info.name, k, k));
  }

  log_debug("plugin '{}' {} ({}) loaded from {}", info.name, info.version, join(info.kinds, ","), where);
  keep_loaded_forever(library);
  plugins_.push_back(info);
  entries_.push_back(Entry{std::move(info), std::move(library), factories});
  return true;
}

const std::vector<PluginInfo>& PluginHost::plugins() const { return plugins_; }
const std::vector<Rejection>& PluginHost::rejected() const { return rejected_; }

const PluginInfo* PluginHost::find(std::string_view name) const {
  for (const auto& p : plugins_) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

std::vector<const PluginInfo*> PluginHost::of_kind(std::string_view kind) const {
  std::vector<const PluginInfo*> out;
  for (const auto& p : plugins_) {
    if (p.has_kind(kind)) out.push_back(&p);
  }
  return out;
}

const PluginHost::Entry& PluginHost::entry(std::string_view name, std::string_view kind) const {
  std::vector<std::string> names;
  for (const auto& e : entries_) {
    if (e.info.has_kind(kind)) names.push_back(e.info.name);
  }
  const std::string available = names.empty() ? fmt::format("no {} plugin was found", kind)
                                              : fmt::format("{} plugins found: {}", kind, join(names, ", "));
  for (const auto& e : entries_) {
    if (e.info.name != name) continue;
    if (!e.info.has_kind(kind)) {
      fail("plugin '{}' ({}) is not a {} plugin (it provides: {}); {}", name, e.info.file.string(), kind,
           join(e.info.kinds, ", "), available);
    }
    return e;
  }
  std::string rejected_note;
  for (const auto& r : rejected_) {
    if (r.file.filename().string().find(std::string(name)) != std::string::npos) {
      rejected_note += fmt::format("; a candidate was rejected: {}", r.reason);
    }
  }
  fail("no {} plugin named '{}' ({}){}; run `specula plugins` to see the search path and rejections", kind, name,
       available, rejected_note);
}

// ---------------------------------------------------------------------------------------------------
// The generic path: every kind's objects are made by make<K> and the plugins found by find_accepting<K>.

template <const auto& K, typename... Args>
auto PluginHost::make(std::string_view name, const nlohmann::json& options, const OptionLocations& where,
                      Args&&... args) const {
  const Entry& e = entry(name, K.name);
  if constexpr (K.options != nullptr) {  // the host's check of a plugin's options, before its factory sees them
    if (const OptionSchema* schema = e.factories->*K.options)
      check_options(*schema, options, fmt::format("{} plugin '{}'", K.name, name), where);
  }
  const auto factory = e.factories->*K.factory;
  auto made = [&] {
    if constexpr (std::is_invocable_v<decltype(factory), Args..., const nlohmann::json&>)
      return factory(std::forward<Args>(args)..., options);
    else
      return factory(std::forward<Args>(args)...);  // a converter takes no options
  }();
  if (!made) fail("{} plugin '{}' returned no object", K.name, name);
  return for_host(std::move(made), e.library);
}

template <const auto& K>
auto PluginHost::find_accepting(const ModelFile& file, const nlohmann::json& options,
                                const OptionLocations& where) const {
  static_assert(K.found_by == FoundBy::File, "find_accepting<K> picks a plugin by what its object accepts");
  std::vector<std::string> tried;
  for (const auto& e : entries_) {
    if (!e.info.has_kind(K.name)) continue;
    auto made = make<K>(e.info.name, {}, {});  // the options are for the plugin that accepts the file
    tried.push_back(fmt::format("{} ({})", e.info.name, made->architecture()));
    if (!made->accepts(file)) continue;
    if constexpr (K.options != nullptr) return make<K>(e.info.name, options, where);
    else return made;
  }
  fail("no {} plugin accepts {} (its architecture: {}; {} plugins tried: {})", K.name, file.path().string(),
       K.architecture_of(file), K.name, tried.empty() ? std::string("none was found") : join(tried, ", "));
}

std::shared_ptr<ModelFormat> PluginHost::make_format(std::string_view name, const nlohmann::json& options) const {
  return make<kFormat>(name, options, {});
}
std::shared_ptr<ComputeBackend> PluginHost::make_backend(std::string_view name, const nlohmann::json& options,
                                                         const OptionLocations& where) const {
  return make<kBackend>(name, options, where);
}
std::shared_ptr<ModelLoader> PluginHost::make_model_loader(std::string_view name, const nlohmann::json& options,
                                                           const OptionLocations& where) const {
  return make<kModel>(name, options, where);
}
std::shared_ptr<DrafterLoader> PluginHost::make_drafter_loader(std::string_view name, const nlohmann::json& options,
                                                               const OptionLocations& where) const {
  return make<kDrafter>(name, options, where);
}
std::shared_ptr<Sampler> PluginHost::make_sampler(std::string_view name, const SamplingParams& params,
                                                  const nlohmann::json& options, const OptionLocations& where) const {
  return make<kSampler>(name, options, where, params);
}
std::shared_ptr<const LmHead> PluginHost::make_lm_head(std::string_view name, const nlohmann::json& options,
                                                       const OptionLocations& where) const {
  return make<kLmHead>(name, options, where);
}
std::shared_ptr<const Attention> PluginHost::make_attention(std::string_view name, const nlohmann::json& options,
                                                            const OptionLocations& where) const {
  return make<kAttention>(name, options, where);
}

std::shared_ptr<ModelLoader> PluginHost::find_model_loader(const ModelFile& file, const nlohmann::json& options,
                                                           const OptionLocations& where) const {
  return find_accepting<kModel>(file, options, where);
}
std::shared_ptr<DrafterLoader> PluginHost::find_drafter_loader(const ModelFile& file, const nlohmann::json& options,
                                                               const OptionLocations& where) const {
  return find_accepting<kDrafter>(file, options, where);
}
std::shared_ptr<Converter> PluginHost::find_converter(const ModelFile& file) const {
  return find_accepting<kConverter>(file, {}, {});
}

const OptionSchema* PluginHost::option_schema(std::string_view name, std::string_view kind) const {
  const PluginFactories* f = entry(name, kind).factories;
  const OptionSchema* schema = nullptr;
  visit_kind(kind, [&](const auto& k) {
    if (k.options) schema = f->*k.options;
  });
  return schema;
}

bool kind_takes_options(std::string_view kind) {
  bool takes = false;
  visit_kind(kind, [&](const auto& k) { takes = k.options != nullptr; });
  return takes;
}

std::shared_ptr<const ModelFile> PluginHost::open_model(const fs::path& path, std::string_view format) const {
  if (hub::is_ref(path.string()))
    fail("model file {} is a Hugging Face id: the plugin host opens local paths (the application resolves ids with "
         "the model hub, specula/hub.hpp)", path.string());
  std::error_code ec;
  if (!fs::exists(path, ec)) fail("model file {} does not exist", path.string());
  if (!format.empty()) {
    auto f = std::static_pointer_cast<PinnedFormat>(make_format(format));
    return f->open_pinned(path);
  }
  std::vector<std::shared_ptr<PinnedFormat>> formats;
  for (const auto& e : entries_) {
    if (!e.info.has_kind(kFormat.name)) continue;
    auto f = std::static_pointer_cast<PinnedFormat>(make_format(e.info.name));
    if (f->can_open(path)) {
      log_debug("opening {} with format plugin '{}'", path.string(), e.info.name);
      return f->open_pinned(path);
    }
    formats.push_back(f);
  }
  if (formats.empty())
    fail("no format plugin can open {}: no format plugin was found; run `specula plugins` to see the search path",
         path.string());
  // Each plugin's own reason: what its open() says about the file.
  std::vector<std::string> reasons;
  for (const auto& f : formats) {
    try {
      f->open(path);
      reasons.push_back(fmt::format("{}: declines it (can_open is false)", f->name()));
    } catch (const std::exception& e) {
      reasons.push_back(fmt::format("{}: {}", f->name(), e.what()));
    }
  }
  fail("no format plugin can open {} ({})", path.string(), join(reasons, "; "));
}

std::shared_ptr<const ModelFormat> PluginHost::make_writer(std::string_view format) const {
  std::vector<std::string> formats;
  for (const auto& e : entries_) {
    if (!e.info.has_kind(kFormat.name)) continue;
    auto f = make_format(e.info.name);
    if (f->name() == format && f->can_write()) return f;
    formats.push_back(fmt::format("{} ({}{})", e.info.name, f->name(), f->can_write() ? ", writes" : ", reads only"));
  }
  fail("no format plugin writes {} files (format plugins found: {}); run `specula plugins` to see the search path "
       "and rejections",
       format, formats.empty() ? std::string("none") : join(formats, ", "));
}

}  // namespace specula::core
