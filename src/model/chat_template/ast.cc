#include "chat_template/ast.h"

#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <sstream>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace sluice::model::jinja {

bool OneOf(std::string_view s, std::initializer_list<std::string_view> list) {
  return std::find(list.begin(), list.end(), s) != list.end();
}

bool IsSupportedFilter(std::string_view name) {
  return OneOf(name,
               {"abs",     "capitalize", "count",      "d",      "default", "first",  "float",  "int",        "items",
                "join",    "last",       "length",     "list",   "lower",   "map",    "reject", "rejectattr", "replace",
                "reverse", "select",     "selectattr", "string", "title",   "tojson", "trim",   "unique",     "upper"});
}

bool IsSupportedTest(std::string_view name) {
  return OneOf(name, {"defined",     "undefined", "none",        "boolean", "true",     "false",    "integer",
                      "float",       "number",    "string",      "mapping", "sequence", "iterable", "callable",
                      "odd",         "even",      "divisibleby", "eq",      "equalto",  "==",       "ne",
                      "!=",          "lt",        "lessthan",    "<",       "le",       "<=",       "gt",
                      "greaterthan", ">",         "ge",          ">=",      "in"});
}

bool IsSupportedStrMethod(std::string_view name) {
  return OneOf(
      name, {"startswith", "endswith", "strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "replace", "upper",
             "lower", "title", "capitalize", "join", "find", "count", "removeprefix", "removesuffix"});
}

bool IsSupportedDictMethod(std::string_view name) { return OneOf(name, {"items", "keys", "values", "get"}); }

bool IsPyStrMethod(std::string_view name) {
  return OneOf(name,
               {"capitalize", "casefold",     "center",       "count",   "encode",     "endswith",    "expandtabs",
                "find",       "format",       "format_map",   "index",   "isalnum",    "isalpha",     "isascii",
                "isdecimal",  "isdigit",      "isidentifier", "islower", "isnumeric",  "isprintable", "isspace",
                "istitle",    "isupper",      "join",         "ljust",   "lower",      "lstrip",      "maketrans",
                "partition",  "removeprefix", "removesuffix", "replace", "rfind",      "rindex",      "rjust",
                "rpartition", "rsplit",       "rstrip",       "split",   "splitlines", "startswith",  "strip",
                "swapcase",   "title",        "translate",    "upper",   "zfill"});
}

bool IsPyDictMethod(std::string_view name) {
  return OneOf(
      name, {"clear", "copy", "fromkeys", "get", "items", "keys", "pop", "popitem", "setdefault", "update", "values"});
}

bool IsPyListMethod(std::string_view name) {
  return OneOf(name,
               {"append", "clear", "copy", "count", "extend", "index", "insert", "pop", "remove", "reverse", "sort"});
}

bool IsGlobalFunction(std::string_view name) {
  return OneOf(name, {"range", "namespace", "dict", "raise_exception", "strftime_now"});
}

}  // namespace sluice::model::jinja
