# One INTERFACE target carries the language standard and warnings, so no global flags are set and
# every Lockstep target opts in by linking it.
add_library(lockstep_options INTERFACE)
add_library(Lockstep::options ALIAS lockstep_options)
target_compile_features(lockstep_options INTERFACE cxx_std_20)
target_compile_options(lockstep_options INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wold-style-cast
    -Wcast-align -Woverloaded-virtual -Wimplicit-fallthrough>
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${LOCKSTEP_WARNINGS_AS_ERRORS}>>:-Werror>
  # GCC 12 reports moves of std::variant holding strings as maybe-uninitialized (GCC bug 105593
  # and relatives); the noise would hide real warnings.
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU>>:-Wno-maybe-uninitialized>)
set(CMAKE_CXX_EXTENSIONS OFF)
