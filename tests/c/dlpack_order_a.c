/* Include-order compatibility with the official DLPack header: official dlpack.h first, then ndx.h.
 * Whichever header comes first provides the declarations (both use the guard
 * DLPACK_DLPACK_H_). Built as C99 and, from a copy, as C++17 when the CMake variable
 * NDX_OFFICIAL_DLPACK_INCLUDE_DIR points at a directory with dlpack/dlpack.h. */
#include <dlpack/dlpack.h>
#include "ndx.h"

#define NDX_ORDER "official dlpack.h first, then ndx.h"
#include "dlpack_order_body.h"
