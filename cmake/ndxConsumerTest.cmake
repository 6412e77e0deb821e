# ctest driver for the out-of-tree consumer tests (cmake -P). Variables (-D):
#   NDX_MODE        install | find_package | pkg_config
#   NDX_BINARY_DIR  the ndx build tree        NDX_SOURCE_DIR  the ndx source tree
#   NDX_PREFIX      install prefix to use     NDX_LIBDIR      CMAKE_INSTALL_LIBDIR
#   NDX_GENERATOR, NDX_C_COMPILER, NDX_BUILD_TYPE   forwarded to the consumer build
#   NDX_PKG_CONFIG  pkg-config executable (pkg_config mode)
cmake_minimum_required(VERSION 3.16...3.25)

function(ndx_run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "failed (${rc}): ${cmd}")
  endif()
endfunction()

set(consumer_src "${NDX_SOURCE_DIR}/tests/consumer")

if(NDX_MODE STREQUAL "install")
  file(REMOVE_RECURSE "${NDX_PREFIX}")
  ndx_run("${CMAKE_COMMAND}" --install "${NDX_BINARY_DIR}" --prefix "${NDX_PREFIX}")
  foreach(f "${NDX_LIBDIR}/libndx.so" "${NDX_LIBDIR}/libndx.a" "include/ndx.h"
            "${NDX_LIBDIR}/cmake/ndx/ndxConfig.cmake" "${NDX_LIBDIR}/pkgconfig/ndx.pc")
    if(NOT EXISTS "${NDX_PREFIX}/${f}")
      message(FATAL_ERROR "install is missing ${f}")
    endif()
  endforeach()

elseif(NDX_MODE STREQUAL "find_package")
  set(bdir "${NDX_BINARY_DIR}/consumer-build")
  file(REMOVE_RECURSE "${bdir}")
  set(bt "${NDX_BUILD_TYPE}")
  if(NOT bt)
    set(bt Release)
  endif()
  ndx_run("${CMAKE_COMMAND}" -S "${consumer_src}" -B "${bdir}" -G "${NDX_GENERATOR}"
          "-DCMAKE_C_COMPILER=${NDX_C_COMPILER}" "-DCMAKE_BUILD_TYPE=${bt}"
          "-DCMAKE_PREFIX_PATH=${NDX_PREFIX}" -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON)
  ndx_run("${CMAKE_COMMAND}" --build "${bdir}")
  foreach(exe consumer_shared consumer_static)
    message(STATUS "running ${exe}")
    ndx_run("${bdir}/${exe}")
  endforeach()

elseif(NDX_MODE STREQUAL "pkg_config")
  set(bdir "${NDX_BINARY_DIR}/consumer-pkg-config")
  file(REMOVE_RECURSE "${bdir}")
  file(MAKE_DIRECTORY "${bdir}")
  set(ENV{PKG_CONFIG_PATH} "${NDX_PREFIX}/${NDX_LIBDIR}/pkgconfig")
  execute_process(COMMAND "${NDX_PKG_CONFIG}" --cflags --libs ndx
                  OUTPUT_VARIABLE flags RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "pkg-config --cflags --libs ndx failed (${rc})")
  endif()
  message(STATUS "pkg-config --cflags --libs ndx: ${flags}")
  separate_arguments(flags UNIX_COMMAND "${flags}")
  ndx_run("${NDX_C_COMPILER}" -std=c99 -Wall -Wextra -Werror "${consumer_src}/main.c"
          ${flags} -o "${bdir}/consumer_pkg_config")
  set(ENV{LD_LIBRARY_PATH} "${NDX_PREFIX}/${NDX_LIBDIR}")
  ndx_run("${bdir}/consumer_pkg_config")

else()
  message(FATAL_ERROR "unknown NDX_MODE '${NDX_MODE}'")
endif()
