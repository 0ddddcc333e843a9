#include "worker/sampling/json_constraint.h"

namespace tinyserve {
namespace {

bool IsWhitespace(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool IsDigit(unsigned char c) { return c >= '0' && c <= '9'; }
bool IsHex(unsigned char c) {
  return IsDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

}  // namespace

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
        mode_ = key_ ? Mode::kColon : Mode::kAfterValue;
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
    case Mode::kNumber: {
      const bool digit = IsDigit(c);
      bool more = false;  // c continues the number
      switch (num_) {
        case Num::kMinus:
          if (!digit) return false;
          num_ = c == '0' ? Num::kZero : Num::kInt;
          more = true;
          break;
        case Num::kInt:
          if (digit) {
            more = true;
            break;
          }
          [[fallthrough]];
        case Num::kZero:
          if (c == '.') {
            num_ = Num::kDot;
            more = true;
          } else if (c == 'e' || c == 'E') {
            num_ = Num::kE;
            more = true;
          }
          break;
        case Num::kDot:
          if (!digit) return false;
          num_ = Num::kFrac;
          more = true;
          break;
        case Num::kFrac:
          if (digit) {
            more = true;
          } else if (c == 'e' || c == 'E') {
            num_ = Num::kE;
            more = true;
          }
          break;
        case Num::kE:
          if (c == '+' || c == '-') {
            num_ = Num::kESign;
            more = true;
            break;
          }
          [[fallthrough]];
        case Num::kESign:
          if (!digit) return false;
          num_ = Num::kExp;
          more = true;
          break;
        case Num::kExp:
          more = digit;
          break;
      }
      if (more) return ++left_ <= kMaxNumber;
      // The number ended (in a state where it may): c belongs to what follows.
      mode_ = Mode::kAfterValue;
      return Byte(c);
    }
    case Mode::kLiteral:
      if (c != static_cast<unsigned char>(*literal_)) return false;
      if (*++literal_ == '\0') mode_ = Mode::kAfterValue;
      return true;
    default:
      break;
  }
  // Between tokens of the grammar: bounded whitespace.
  if (IsWhitespace(c)) return ++whitespace_ <= kMaxWhitespace;
  whitespace_ = 0;
  switch (mode_) {
    case Mode::kStart:
      return c == '{' && StartValue(c);
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
    case '-':
      mode_ = Mode::kNumber;
      num_ = Num::kMinus;
      left_ = 1;
      return true;
    default:
      if (!IsDigit(c)) return false;
      mode_ = Mode::kNumber;
      num_ = c == '0' ? Num::kZero : Num::kInt;
      left_ = 1;
      return true;
  }
}

bool JsonRecognizer::Close(unsigned char c) {
  if (depth_ == 0 || c != (stack_[depth_ - 1] == '{' ? '}' : ']')) return false;
  --depth_;
  mode_ = depth_ == 0 ? Mode::kDone : Mode::kAfterValue;
  return true;
}

bool JsonObjectConstraint::Allows(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= table_->kind.size()) return false;
  switch (table_->kind[id]) {
    case TokenTable::kEnd:
      return state_.Complete();
    case TokenTable::kSpecial:
      return false;
    default:
      break;
  }
  const std::string& bytes = table_->bytes[id];
  if (bytes.empty()) return false;
  JsonRecognizer next = state_;
  return next.Feed(bytes);
}

void JsonObjectConstraint::Accept(int32_t id) {
  if (id >= 0 && static_cast<size_t>(id) < table_->kind.size() &&
      table_->kind[id] == TokenTable::kNormal) {
    state_.Feed(table_->bytes[id]);
  }
}

}  // namespace tinyserve
