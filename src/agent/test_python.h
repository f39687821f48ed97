// Private to the agent tests: the Python interpreter real workers and
// sandboxed runs use (SLUICE_TEST_PYTHON, else /usr/bin/python3, else
// python3 on PATH).
#ifndef SLUICE_SRC_AGENT_TEST_PYTHON_H_
#define SLUICE_SRC_AGENT_TEST_PYTHON_H_

#include <unistd.h>

#include <cstdlib>
#include <string>

namespace sluice::agent {

inline std::string TestPython() {
  if (const char* env = std::getenv("SLUICE_TEST_PYTHON"); env != nullptr && *env != '\0') return env;
  if (::access("/usr/bin/python3", X_OK) == 0) return "/usr/bin/python3";
  return "python3";
}

}  // namespace sluice::agent

#endif  // SLUICE_SRC_AGENT_TEST_PYTHON_H_
