# tinyserve_test(NAME SOURCES... [LIBS ...] [LABELS ...]): one GoogleTest executable, one CTest entry.
# Tests run from the source root so that they find ../shared/data the same way as the tools.
function(tinyserve_test name)
  if(NOT TINYSERVE_BUILD_TESTS)
    return()
  endif()
  cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${T_SOURCES} ${T_UNPARSED_ARGUMENTS})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main GTest::gmock)
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  add_test(NAME ${name} COMMAND ${name} WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT})
  if(T_LABELS)
    set_tests_properties(${name} PROPERTIES LABELS "${T_LABELS}")
  endif()
endfunction()

# The Python that test fixtures and script tests run: the project venv (scripts/setup) when it
# exists, else the system's python3.
if(EXISTS ${CMAKE_SOURCE_DIR}/.venv/bin/python)
  set(TINYSERVE_TEST_PYTHON ${CMAKE_SOURCE_DIR}/.venv/bin/python)
else()
  find_package(Python3 COMPONENTS Interpreter)
  set(TINYSERVE_TEST_PYTHON ${Python3_EXECUTABLE})
endif()
