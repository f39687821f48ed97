# Helpers that give every Sluice target the same flags, per target (never global).

set(SLUICE_WARNINGS -Wall -Wextra -Wno-unused-parameter)
if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  # Checks every SLUICE_GUARDED_BY / SLUICE_REQUIRES annotation; the core-tsan
  # preset builds with clang so the test command enforces them.
  list(APPEND SLUICE_WARNINGS -Wthread-safety)
endif()
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  # GCC 12 at -O3 reports -Wrestrict inside libstdc++'s std::string code for
  # ordinary concatenations (a known false positive, GCC bug 105329).
  list(APPEND SLUICE_WARNINGS -Wno-restrict)
endif()
if(SLUICE_WERROR)
  list(APPEND SLUICE_WARNINGS -Werror)
endif()

set(SLUICE_SANITIZE_FLAGS "")
if(SLUICE_SANITIZE)
  string(REPLACE ";" "," _sluice_san "${SLUICE_SANITIZE}")
  set(SLUICE_SANITIZE_FLAGS -fsanitize=${_sluice_san} -fno-omit-frame-pointer)
endif()

function(sluice_setup_target target)
  target_compile_options(${target} PRIVATE ${SLUICE_WARNINGS} ${SLUICE_SANITIZE_FLAGS})
  if(SLUICE_SANITIZE_FLAGS)
    target_link_options(${target} PRIVATE ${SLUICE_SANITIZE_FLAGS})
  endif()
  # Programs (never libraries: a library loaded into Python must not bring its
  # own malloc) link the chosen allocator, whose malloc then serves the whole
  # process, libtorch included.
  get_target_property(_type ${target} TYPE)
  if(SLUICE_MALLOC_LIBRARY AND _type STREQUAL "EXECUTABLE")
    target_link_libraries(${target} PRIVATE ${SLUICE_MALLOC_LIBRARY})
  endif()
endfunction()

# Targets whose sources include libtorch headers share one precompiled header,
# owned by sluice_model (the first such target): each <torch/torch.h> costs
# ~25 s to parse, the shared PCH brings that to ~11 s.
function(sluice_use_torch_pch target)
  if(target STREQUAL "sluice_model")
    target_precompile_headers(${target} PRIVATE <torch/torch.h>)
  else()
    target_precompile_headers(${target} REUSE_FROM sluice_model)
    get_target_property(_type ${target} TYPE)
    if(_type STREQUAL "EXECUTABLE")
      # Executables default to -fPIE, the PCH is built -fPIC; compile them -fPIC
      # too so gcc accepts the PCH (a PIE links PIC objects fine).
      set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE OFF)
      target_compile_options(${target} PRIVATE -fPIC)
    endif()
  endif()
endfunction()

# sluice_test(NAME src... LIBS libs... [LABELS l...] [TORCH])
function(sluice_test name)
  cmake_parse_arguments(T "TORCH" "" "SRCS;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${T_SRCS})
  sluice_setup_target(${name})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest sluice_test_main)
  if(T_TORCH)
    sluice_use_torch_pch(${name})
  endif()
  add_test(NAME ${name} COMMAND ${name})
  set(_labels unit)
  if(T_LABELS)
    set(_labels ${T_LABELS})
  endif()
  set_tests_properties(${name} PROPERTIES LABELS "${_labels}" TIMEOUT 600
                       ENVIRONMENT "OMP_WAIT_POLICY=PASSIVE;OMP_NUM_THREADS=1")
endfunction()
