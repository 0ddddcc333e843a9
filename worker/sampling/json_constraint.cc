#include "worker/sampling/json_constraint.h"

#include <algorithm>

namespace tinyserve {
namespace {

bool IsDigit(unsigned char c) { return c >= '0' && c <= '9'; }
bool IsHex(unsigned char c) {
  return IsDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

}  // namespace

bool NumberStart(unsigned char c, NumState* state) {
  if (c == '-') {
    *state = NumState::kMinus;
  } else if (IsDigit(c)) {
    *state = c == '0' ? NumState::kZero : NumState::kInt;
  } else {
    return false;
  }
  return true;
}

NumStep NumberNext(unsigned char c, bool integer, NumState* state) {
  const bool digit = IsDigit(c);
  switch (*state) {
    case NumState::kMinus:
      if (!digit) return NumStep::kReject;
      *state = c == '0' ? NumState::kZero : NumState::kInt;
      return NumStep::kMore;
    case NumState::kInt:
      if (digit) return NumStep::kMore;
      [[fallthrough]];
    case NumState::kZero:
      if (c == '.' && !integer) {
        *state = NumState::kDot;
      } else if ((c == 'e' || c == 'E') && !integer) {
        *state = NumState::kE;
      } else {
        return NumStep::kEnded;
      }
      return NumStep::kMore;
    case NumState::kDot:
      if (!digit) return NumStep::kReject;
      *state = NumState::kFrac;
      return NumStep::kMore;
    case NumState::kFrac:
      if (digit) return NumStep::kMore;
      if (c != 'e' && c != 'E') return NumStep::kEnded;
      *state = NumState::kE;
      return NumStep::kMore;
    case NumState::kE:
      if (c == '+' || c == '-') {
        *state = NumState::kESign;
        return NumStep::kMore;
      }
      [[fallthrough]];
    case NumState::kESign:
      if (!digit) return NumStep::kReject;
      *state = NumState::kExp;
      return NumStep::kMore;
    case NumState::kExp:
      return digit ? NumStep::kMore : NumStep::kEnded;
  }
  return NumStep::kReject;
}

bool JsonRecognizer::Feed(std::string_view bytes) {
  for (unsigned char c : bytes) {
    if (!Byte(c)) return false;
  }
  return true;
}

bool JsonRecognizer::Byte(unsigned char c) {
  switch (mode_) {
    case Mode::kString:
      if (c == '"') {
        mode_ = key_ ? Mode::kColon : AfterValue();
        return true;
      }
      if (c == '\\') {
        mode_ = Mode::kEscape;
        return true;
      }
      return c >= 0x20;  // control characters must be escaped
    case Mode::kEscape:
      if (c == 'u') {
        mode_ = Mode::kUnicode;
        left_ = 4;
        return true;
      }
      if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' ||
          c == 't') {
        mode_ = Mode::kString;
        return true;
      }
      return false;
    case Mode::kUnicode:
      if (!IsHex(c)) return false;
      if (--left_ == 0) mode_ = Mode::kString;
      return true;
    case Mode::kNumber:
      switch (NumberNext(c, /*integer=*/false, &num_)) {
        case NumStep::kMore:
          return ++left_ <= kMaxJsonNumber;
        case NumStep::kEnded:  // c belongs to what follows
          mode_ = AfterValue();
          return Byte(c);
        default:
          return false;
      }
    case Mode::kLiteral:
      if (c != static_cast<unsigned char>(*literal_)) return false;
      if (*++literal_ == '\0') mode_ = AfterValue();
      return true;
    default:
      break;
  }
  // Between tokens of the grammar: bounded whitespace.
  if (IsJsonWhitespace(c))
    return (mode_ != Mode::kDone || trailing_space_) && ++whitespace_ <= kMaxJsonWhitespace;
  whitespace_ = 0;
  switch (mode_) {
    case Mode::kStart:
      return (c == '{' || !object_only_) && StartValue(c);
    case Mode::kValue:
      return StartValue(c);
    case Mode::kValueOrClose:
      return c == ']' ? Close(c) : StartValue(c);
    case Mode::kKeyOrClose:
      if (c == '}') return Close(c);
      [[fallthrough]];
    case Mode::kKey:
      if (c != '"') return false;
      mode_ = Mode::kString;
      key_ = true;
      return true;
    case Mode::kColon:
      if (c != ':') return false;
      mode_ = Mode::kValue;
      return true;
    case Mode::kAfterValue:
      if (c == ',') {
        mode_ = stack_[depth_ - 1] == '{' ? Mode::kKey : Mode::kValue;
        return true;
      }
      return Close(c);
    default:  // kDone: only whitespace
      return false;
  }
}

bool JsonRecognizer::StartValue(unsigned char c) {
  switch (c) {
    case '{':
    case '[':
      if (depth_ == kMaxDepth) return false;
      stack_[depth_++] = static_cast<char>(c);
      mode_ = c == '{' ? Mode::kKeyOrClose : Mode::kValueOrClose;
      return true;
    case '"':
      mode_ = Mode::kString;
      key_ = false;
      return true;
    case 't':
      literal_ = "rue";
      mode_ = Mode::kLiteral;
      return true;
    case 'f':
      literal_ = "alse";
      mode_ = Mode::kLiteral;
      return true;
    case 'n':
      literal_ = "ull";
      mode_ = Mode::kLiteral;
      return true;
    default:
      if (!NumberStart(c, &num_)) return false;
      mode_ = Mode::kNumber;
      left_ = 1;
      return true;
  }
}

bool JsonRecognizer::Close(unsigned char c) {
  if (depth_ == 0 || c != (stack_[depth_ - 1] == '{' ? '}' : ']')) return false;
  --depth_;
  mode_ = AfterValue();
  return true;
}

void TokenTable::Index() {
  sorted.clear();
  shared.clear();
  max_bytes = 0;
  for (size_t id = 0; id < bytes.size(); ++id) {
    if (kind[id] == kNormal && !bytes[id].empty()) sorted.push_back(static_cast<int32_t>(id));
    max_bytes = std::max(max_bytes, bytes[id].size());
  }
  std::sort(sorted.begin(), sorted.end(),
            [&](int32_t a, int32_t b) { return bytes[a] < bytes[b]; });
  for (size_t i = 0; i < sorted.size(); ++i) {
    size_t n = 0;
    if (i > 0) {
      const std::string& a = bytes[sorted[i - 1]];
      const std::string& b = bytes[sorted[i]];
      while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
    }
    shared.push_back(static_cast<uint16_t>(std::min<size_t>(n, UINT16_MAX)));
  }
}

}  // namespace tinyserve
