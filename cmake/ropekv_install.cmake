# `cmake --install`: headers, the static libraries, the `ropekv` binary, a CMake package
# (find_package(ropekv CONFIG) -> ropekv::core, ::reference, ::sim, ::harness, ::kernel,
# ::plugin_abi, ::gpu when built) and a pkg-config file. docs/cpp.md describes the layout:
# headers keep the source tree's paths under include/ropekv/ ("core/op.h" keeps working), and
# ropekv's own top-level headers are include/ropekv/version.h and include/ropekv/plugin.h,
# reached as "ropekv/version.h" (include/ is on the INTERFACE include path too).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(ROPEKV_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/ropekv)
set(ROPEKV_INSTALL_TREE_INCLUDEDIR ${CMAKE_INSTALL_INCLUDEDIR}/ropekv)  # "core/op.h" root

# The contract version: read from core/op.h (the one place it is written).
file(STRINGS ${PROJECT_SOURCE_DIR}/core/op.h ROPEKV_CONTRACT_LINE
     REGEX "inline constexpr int contract_version = [0-9]+;")
string(REGEX REPLACE ".*= ([0-9]+).*" "\\1" ROPEKV_CONTRACT_VERSION "${ROPEKV_CONTRACT_LINE}")
if(NOT ROPEKV_CONTRACT_VERSION MATCHES "^[0-9]+$")
  message(FATAL_ERROR "core/op.h: expected a line 'inline constexpr int contract_version = N;', got '${ROPEKV_CONTRACT_LINE}'")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/version.h.in ${PROJECT_BINARY_DIR}/include/ropekv/version.h @ONLY)

# Header-only targets: the plugin ABI (plain C) with the version header, and the GPU kernel.
add_library(ropekv_plugin_abi INTERFACE)
target_include_directories(ropekv_plugin_abi INTERFACE
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include> $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
set_target_properties(ropekv_plugin_abi PROPERTIES EXPORT_NAME plugin_abi)
add_library(ropekv_kernel INTERFACE)
target_include_directories(ropekv_kernel INTERFACE $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
                                                   $<INSTALL_INTERFACE:${ROPEKV_INSTALL_TREE_INCLUDEDIR}>)
set_target_properties(ropekv_kernel PROPERTIES EXPORT_NAME kernel)
add_library(ropekv::plugin_abi ALIAS ropekv_plugin_abi)
add_library(ropekv::kernel ALIAS ropekv_kernel)

set_target_properties(ropekv_core PROPERTIES EXPORT_NAME core)
set_target_properties(ropekv_cpu PROPERTIES EXPORT_NAME reference)
set_target_properties(ropekv_sim PROPERTIES EXPORT_NAME sim)
set_target_properties(ropekv_harness PROPERTIES EXPORT_NAME harness)
# Installed consumers of core also get ropekv/version.h and ropekv/plugin.h.
target_include_directories(ropekv_core INTERFACE $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
set(ROPEKV_EXPORTED ropekv_core ropekv_cpu ropekv_sim ropekv_harness ropekv_kernel ropekv_plugin_abi)
set(ROPEKV_HAVE_GPU_TARGET FALSE)
if(TARGET ropekv_hip)
  set_target_properties(ropekv_hip PROPERTIES EXPORT_NAME gpu)
  list(APPEND ROPEKV_EXPORTED ropekv_hip)
  set(ROPEKV_HAVE_GPU_TARGET TRUE)
endif()

install(TARGETS ${ROPEKV_EXPORTED} EXPORT ropekv_targets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS ropekv RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

# Headers, keeping the source tree's paths.
file(GLOB ROPEKV_CORE_HEADERS ${PROJECT_SOURCE_DIR}/core/*.h)
file(GLOB ROPEKV_HARNESS_HEADERS ${PROJECT_SOURCE_DIR}/harness/*.h)
install(FILES ${ROPEKV_CORE_HEADERS} DESTINATION ${ROPEKV_INSTALL_TREE_INCLUDEDIR}/core)
install(FILES ${ROPEKV_HARNESS_HEADERS} DESTINATION ${ROPEKV_INSTALL_TREE_INCLUDEDIR}/harness)
install(FILES ${PROJECT_SOURCE_DIR}/backends/cpu/cpu_backend.h DESTINATION ${ROPEKV_INSTALL_TREE_INCLUDEDIR}/backends/cpu)
install(FILES ${PROJECT_SOURCE_DIR}/backends/sim/sim_backend.h DESTINATION ${ROPEKV_INSTALL_TREE_INCLUDEDIR}/backends/sim)
# the kernel's source: kernel.h and every header it includes (kernel_*.h, one per role)
file(GLOB ROPEKV_KERNEL_PART_HEADERS ${PROJECT_SOURCE_DIR}/backends/hip/kernel_*.h)
install(FILES ${PROJECT_SOURCE_DIR}/backends/hip/kernel.h ${ROPEKV_KERNEL_PART_HEADERS}
              ${PROJECT_SOURCE_DIR}/backends/hip/gpu_compat.h ${PROJECT_SOURCE_DIR}/backends/hip/fp8_encode.h
        DESTINATION ${ROPEKV_INSTALL_TREE_INCLUDEDIR}/backends/hip)
if(TARGET ropekv_hip)
  install(FILES ${PROJECT_SOURCE_DIR}/backends/hip/hip_backend.h DESTINATION ${ROPEKV_INSTALL_TREE_INCLUDEDIR}/backends/hip)
endif()
install(FILES ${PROJECT_BINARY_DIR}/include/ropekv/version.h ${PROJECT_SOURCE_DIR}/include/ropekv/plugin.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ropekv)

install(EXPORT ropekv_targets NAMESPACE ropekv:: FILE ropekvTargets.cmake DESTINATION ${ROPEKV_INSTALL_CMAKEDIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/ropekvConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/ropekvConfig.cmake
                              INSTALL_DESTINATION ${ROPEKV_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ropekvConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ropekvConfig.cmake ${PROJECT_BINARY_DIR}/ropekvConfigVersion.cmake
        DESTINATION ${ROPEKV_INSTALL_CMAKEDIR})

# pkg-config: the libraries (reference, sim, harness, core) with their flags.
# Relocatable: the prefix is found from the .pc file's own folder (cmake --install --prefix X).
file(RELATIVE_PATH ROPEKV_PC_TO_PREFIX /ropekv_prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /ropekv_prefix)
configure_file(${PROJECT_SOURCE_DIR}/cmake/ropekv.pc.in ${PROJECT_BINARY_DIR}/ropekv.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/ropekv.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
