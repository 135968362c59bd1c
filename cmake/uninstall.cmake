# SPDX-License-Identifier: Apache-2.0
# uninstall.cmake: removes every file an install wrote, as listed in its
# manifest (cmake --install writes install_manifest.txt in the build
# folder), then the folders this leaves empty under the prefix's own
# encache folder (lib/cmake/encache).  Run by the `uninstall` target:
#
#   cmake -DMANIFEST=build/install_manifest.txt -P cmake/uninstall.cmake
#
# DESTDIR is honoured as by the install.
if(NOT DEFINED MANIFEST)
  message(FATAL_ERROR "uninstall.cmake: set -DMANIFEST=PATH/install_manifest.txt")
endif()
if(NOT EXISTS "${MANIFEST}")
  message(FATAL_ERROR "uninstall.cmake: ${MANIFEST} does not exist: nothing was installed from this build folder (run cmake --install first)")
endif()
file(STRINGS "${MANIFEST}" _files)
set(_removed 0)
foreach(_file IN LISTS _files)
  set(_path "$ENV{DESTDIR}${_file}")
  if(IS_SYMLINK "${_path}" OR EXISTS "${_path}")
    file(REMOVE "${_path}")
    if(IS_SYMLINK "${_path}" OR EXISTS "${_path}")
      message(FATAL_ERROR "uninstall.cmake: cannot remove ${_path}")
    endif()
    message(STATUS "Removed: ${_path}")
    math(EXPR _removed "${_removed} + 1")
    get_filename_component(_dir "${_path}" DIRECTORY)
    get_filename_component(_dirname "${_dir}" NAME)
    # The package's own folder goes when empty; shared ones (lib, bin)
    # stay.
    if(_dirname STREQUAL "encache" AND IS_DIRECTORY "${_dir}")
      file(GLOB _left "${_dir}/*")
      if(NOT _left)
        file(REMOVE_RECURSE "${_dir}")
      endif()
    endif()
  else()
    message(STATUS "Already gone: ${_path}")
  endif()
endforeach()
message(STATUS "uninstall: ${_removed} files removed")
