#include "sluice/common/strings.h"

namespace sluice {

std::string Quoted(std::string_view name) {
  // Appended piecewise: `"'" + std::string(name)` trips a GCC 12 -Wrestrict false positive.
  std::string out;
  out.reserve(name.size() + 2);
  out.push_back('\'');
  out.append(name);
  out.push_back('\'');
  return out;
}

}  // namespace sluice

namespace sluice {

namespace {

// The length of the well-formed UTF-8 sequence at s[i] (i < n), or 0.
size_t SequenceAt(const unsigned char* s, size_t i, size_t n) {
  const unsigned char lead = s[i];
  if (lead < 0x80) return 1;
  size_t len = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range
  if (lead >= 0xC2 && lead <= 0xDF) {
    len = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    len = 3;
    if (lead == 0xE0) lo = 0xA0;  // overlong
    if (lead == 0xED) hi = 0x9F;  // surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    len = 4;
    if (lead == 0xF0) lo = 0x90;  // overlong
    if (lead == 0xF4) hi = 0x8F;  // past U+10FFFF
  } else {
    return 0;
  }
  if (i + len > n || s[i + 1] < lo || s[i + 1] > hi) return 0;
  for (size_t k = 2; k < len; ++k) {
    if ((s[i + k] & 0xC0) != 0x80) return 0;
  }
  return len;
}

}  // namespace

bool IsValidUtf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  for (size_t i = 0; i < text.size();) {
    const size_t len = SequenceAt(s, i, text.size());
    if (len == 0) return false;
    i += len;
  }
  return true;
}

std::string ValidUtf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const size_t len = SequenceAt(s, i, text.size());
    if (len == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD
      ++i;
    } else {
      out.append(text.substr(i, len));
      i += len;
    }
  }
  return out;
}

}  // namespace sluice
