# Fails when the gfx942 assembly of the kernel calls an external function (a device-library
# function that -nogpulib left unresolved); else renames ASM to OUT.
file(READ ${ASM} text)
string(FIND "${text}" "amdhsa_kernel" has_kernel)
if(has_kernel EQUAL -1)
  message(FATAL_ERROR "gfx942 check: no kernel descriptor in ${ASM}")
endif()
string(FIND "${text}" "s_swappc" has_call)
if(NOT has_call EQUAL -1)
  message(FATAL_ERROR "gfx942 check: the kernel calls an external function (see ${ASM}); "
                      "a device-library function is not available for gfx942 here")
endif()
file(RENAME ${ASM} ${OUT})
