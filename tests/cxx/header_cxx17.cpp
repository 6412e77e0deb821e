// Header self-containment check: ndx.h alone must compile as C++17
// (-std=c++17 -pedantic -Wall -Wextra -Werror). Built as an object by CMake.
#include "ndx.h"

namespace {
[[maybe_unused]] uint32_t (*const version_fn)(void) = ndx_version;
[[maybe_unused]] const char* (*const version_string_fn)(void) = ndx_version_string;
}  // namespace
