// A shared library that is not a Specula plugin: it exports a function, but not the entry symbol.
extern "C" __attribute__((visibility("default"))) int specula_something_else() { return 42; }
