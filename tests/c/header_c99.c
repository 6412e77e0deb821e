/* Header self-containment check: ndx.h alone must compile as strict C99
 * (-std=c99 -pedantic -Wall -Wextra -Werror). Built as an object by CMake. */
#include "ndx.h"

/* ISO C forbids an empty translation unit; use something from the header. */
typedef uint32_t (*ndx_header_c99_version_fn)(void);
extern const ndx_header_c99_version_fn ndx_header_c99_version;
const ndx_header_c99_version_fn ndx_header_c99_version = ndx_version;
