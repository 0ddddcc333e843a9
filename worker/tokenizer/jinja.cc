// File: worker/tokenizer/jinja.cc
// A lexer (whitespace control as transformers configures Jinja2), a recursive-descent parser
// to a small tree, and a tree-walking renderer over nlohmann JSON values. Errors inside are
// thrown as jinja::Error and become a Status at Parse and Render: no exception leaves the file.
#include "worker/tokenizer/jinja.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tinyserve::jinja {

using json = nlohmann::ordered_json;

namespace {

struct Error {
  std::string message;
};
[[noreturn]] void Fail(std::string message) { throw Error{std::move(message)}; }

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }

// ---------------------------------------------------------------------------------------------
// Lexer

enum class T {
  kText,
  kVarBegin,
  kVarEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kNumber,
  kOp,
  kEof
};

struct Token {
  T kind;
  std::string text;  // text, name, operator or the string literal's value
  json number;       // kNumber
  size_t pos = 0;
};

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | cp >> 6));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | cp >> 12));
    out->push_back(static_cast<char>(0x80 | (cp >> 6 & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | cp >> 18));
    out->push_back(static_cast<char>(0x80 | (cp >> 12 & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp >> 6 & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

class Lexer {
 public:
  explicit Lexer(std::string_view s) : s_(s) {}

  std::vector<Token> Run() {
    const size_t n = s_.size();
    while (pos_ < n) {
      size_t start = s_.find('{', pos_);
      while (start != std::string_view::npos &&
             (start + 1 >= n ||
              (s_[start + 1] != '{' && s_[start + 1] != '%' && s_[start + 1] != '#'))) {
        start = s_.find('{', start + 1);
      }
      const bool tag = start != std::string_view::npos;
      const size_t text_end = tag ? start : n;
      size_t begin = pos_;
      if (strip_next_) {
        while (begin < text_end && IsSpace(s_[begin])) ++begin;
      } else if (trim_newline_) {  // trim_blocks
        if (begin < text_end && s_[begin] == '\n') {
          ++begin;
        } else if (begin + 1 < text_end && s_[begin] == '\r' && s_[begin + 1] == '\n') {
          begin += 2;
        }
      }
      strip_next_ = trim_newline_ = false;
      size_t stop = text_end;
      if (tag) {
        const char kind = s_[start + 1];
        const char marker = start + 2 < n ? s_[start + 2] : '\0';
        if (marker == '-') {
          while (stop > begin && IsSpace(s_[stop - 1])) --stop;
        } else if (kind != '{' && marker != '+') {  // lstrip_blocks: a block alone on its line
          size_t line = stop;
          while (line > begin && (s_[line - 1] == ' ' || s_[line - 1] == '\t')) --line;
          if (line == 0 || s_[line - 1] == '\n') stop = line;
        }
      }
      if (stop > begin)
        out_.push_back({T::kText, std::string(s_.substr(begin, stop - begin)), {}, begin});
      if (!tag) break;
      if (s_[start + 1] == '#') {
        const size_t end = s_.find("#}", start + 2);
        if (end == std::string_view::npos) Fail(absl::StrCat("unclosed comment at ", start));
        strip_next_ = s_[end - 1] == '-';
        trim_newline_ = !strip_next_ && s_[end - 1] != '+';
        pos_ = end + 2;
        continue;
      }
      Tag(start);
    }
    out_.push_back({T::kEof, "", {}, n});
    return std::move(out_);
  }

 private:
  void Tag(size_t start) {
    const size_t n = s_.size();
    const bool block = s_[start + 1] == '%';
    const char close = block ? '%' : '}';
    out_.push_back({block ? T::kBlockBegin : T::kVarBegin, "", {}, start});
    size_t p = start + 2;
    if (p < n && (s_[p] == '-' || s_[p] == '+')) ++p;
    int braces = 0;
    for (;;) {
      while (p < n && IsSpace(s_[p])) ++p;
      if (p >= n) Fail(absl::StrCat("unclosed tag at ", start));
      size_t q = p;
      const char marker = s_[q] == '-' || s_[q] == '+' ? s_[q] : '\0';
      if (marker != '\0') ++q;
      if (braces == 0 && q + 1 < n && s_[q] == close && s_[q + 1] == '}') {
        out_.push_back({block ? T::kBlockEnd : T::kVarEnd, "", {}, p});
        strip_next_ = marker == '-';
        trim_newline_ = block && marker == '\0';
        pos_ = q + 2;
        return;
      }
      const char c = s_[p];
      if (c == '\'' || c == '"') {
        p = String(p);
      } else if (IsDigit(c)) {
        size_t e = p;
        while (e < n && IsDigit(s_[e])) ++e;
        while (e + 1 < n && s_[e] == '_' && IsDigit(s_[e + 1])) {  // 1_000
          ++e;
          while (e < n && IsDigit(s_[e])) ++e;
        }
        bool fraction = e + 1 < n && s_[e] == '.' && IsDigit(s_[e + 1]);
        if (fraction) {
          ++e;
          while (e < n && (IsDigit(s_[e]) || (s_[e] == '_' && e + 1 < n && IsDigit(s_[e + 1]))))
            ++e;
        }
        if (e < n && (s_[e] == 'e' || s_[e] == 'E')) {  // 1e3, 2.5e-4
          size_t x = e + 1;
          if (x < n && (s_[x] == '+' || s_[x] == '-')) ++x;
          if (x < n && IsDigit(s_[x])) {
            while (x < n && IsDigit(s_[x])) ++x;
            e = x;
            fraction = true;
          }
        }
        std::string text(s_.substr(p, e - p));
        text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
        json number;
        if (fraction) {
          number = std::strtod(text.c_str(), nullptr);
        } else {
          number = static_cast<int64_t>(std::strtoll(text.c_str(), nullptr, 10));
        }
        out_.push_back({T::kNumber, text, number, p});
        p = e;
      } else if (IsNameStart(c)) {
        size_t e = p;
        while (e < n && IsNameChar(s_[e])) ++e;
        out_.push_back({T::kName, std::string(s_.substr(p, e - p)), {}, p});
        p = e;
      } else {
        static constexpr std::string_view kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op(1, c);
        for (std::string_view two : kTwo) {
          if (s_.substr(p, 2) == two) op = std::string(two);
        }
        if (op.size() == 1 &&
            std::string_view("+-*/%~<>=()[]{}.,:|").find(c) == std::string_view::npos) {
          Fail(absl::StrCat("unexpected character '", std::string(1, c), "' at ", p));
        }
        if (op == "{") ++braces;
        if (op == "}") --braces;
        out_.push_back({T::kOp, op, {}, p});
        p += op.size();
      }
    }
  }

  // A quoted literal at p, with Python's escapes; returns the offset after it.
  size_t String(size_t p) {
    const size_t n = s_.size();
    const char quote = s_[p];
    std::string value;
    size_t i = p + 1;
    for (;; ++i) {
      if (i >= n) Fail(absl::StrCat("unclosed string at ", p));
      const char c = s_[i];
      if (c == quote) break;
      if (c != '\\' || i + 1 >= n) {
        value.push_back(c);
        continue;
      }
      const char e = s_[++i];
      auto hex = [&](int digits) {
        if (i + digits >= n) Fail(absl::StrCat("bad escape at ", i));
        uint32_t cp = 0;
        for (int k = 1; k <= digits; ++k) {
          const char h = s_[i + k];
          const int d = IsDigit(h)                               ? h - '0'
                        : (h | 0x20) >= 'a' && (h | 0x20) <= 'f' ? (h | 0x20) - 'a' + 10
                                                                 : -1;
          if (d < 0) Fail(absl::StrCat("bad escape at ", i));
          cp = cp * 16 + static_cast<uint32_t>(d);
        }
        i += digits;
        AppendUtf8(cp, &value);
      };
      switch (e) {
        case 'n':
          value.push_back('\n');
          break;
        case 't':
          value.push_back('\t');
          break;
        case 'r':
          value.push_back('\r');
          break;
        case 'b':
          value.push_back('\b');
          break;
        case 'f':
          value.push_back('\f');
          break;
        case 'v':
          value.push_back('\v');
          break;
        case 'a':
          value.push_back('\a');
          break;
        case '\\':
        case '\'':
        case '"':
          value.push_back(e);
          break;
        case '\n':
          break;  // a line continuation
        case 'x':
          hex(2);
          break;
        case '0':
        case '1':
        case '2':
        case '3':
        case '4':
        case '5':
        case '6':
        case '7': {
          uint32_t cp = static_cast<uint32_t>(e - '0');  // up to three octal digits
          for (int k = 0; k < 2 && i + 1 < n && s_[i + 1] >= '0' && s_[i + 1] <= '7'; ++k) {
            cp = cp * 8 + static_cast<uint32_t>(s_[++i] - '0');
          }
          AppendUtf8(cp, &value);
          break;
        }
        case 'u':
          hex(4);
          break;
        case 'U':
          hex(8);
          break;
        default:
          value.push_back('\\');
          value.push_back(e);  // Python keeps unknown escapes
      }
    }
    out_.push_back({T::kString, value, {}, p});
    return i + 1;
  }

  std::string_view s_;
  size_t pos_ = 0;
  bool strip_next_ = false;    // the last tag ended with "-": the next text loses its leading space
  bool trim_newline_ = false;  // the last tag was a block or comment: one newline goes
  std::vector<Token> out_;
};

// ---------------------------------------------------------------------------------------------
// Tree

struct Expr;
using ExprP = std::unique_ptr<Expr>;

struct Expr {
  enum Kind {
    kLiteral,
    kName,
    kAttr,
    kItem,
    kSlice,
    kCall,
    kFilter,
    kTest,
    kNeg,
    kBinary,
    kAnd,
    kOr,
    kNot,
    kCond,
    kList,
    kDict
  } kind;
  size_t pos = 0;
  json literal;             // kLiteral
  std::string name;         // kName; kAttr's attribute; kFilter's and kTest's name; kBinary's op
  std::vector<ExprP> args;  // operands, callee or value first; a null slot is an absent part
  std::vector<std::pair<std::string, ExprP>> kwargs;  // kCall, kFilter
  bool negated = false;                               // kTest: "is not"
  int depth = 1;                                      // of the tree below (bounded: Parser::Push)
};

struct Node {
  enum Kind { kText, kOutput, kIf, kFor, kSet, kSetBlock, kBreak, kContinue, kBlock };
  explicit Node(Kind k, std::string t = "") : kind(k), text(std::move(t)) {}
  Kind kind;
  std::string text;                  // kText; kSet/kSetBlock: the variable
  std::string attr;                  // kSet: a namespace attribute, or empty
  std::vector<std::string> targets;  // kFor
  std::vector<ExprP> exprs;          // kOutput [value]; kIf conditions; kFor [iterable, filter]
  std::vector<std::vector<Node>> bodies;  // kIf: one per condition, then else; kFor: body, else
};

const std::set<std::string, std::less<>>& Filters() {
  static const std::set<std::string, std::less<>> k = {
      "abs",   "capitalize", "count",   "d",       "default", "first",      "float",
      "int",   "items",      "join",    "last",    "length",  "list",       "lower",
      "map",   "rejectattr", "replace", "reverse", "safe",    "selectattr", "string",
      "title", "tojson",     "trim",    "upper",   "select",  "reject"};
  return k;
}

const std::set<std::string, std::less<>>& Tests() {
  static const std::set<std::string, std::less<>> k = {
      "boolean", "defined",  "divisibleby", "eq",   "equalto",   "even",     "false",
      "float",   "ge",       "gt",          "in",   "integer",   "iterable", "le",
      "lower",   "lt",       "mapping",     "ne",   "none",      "number",   "odd",
      "sameas",  "sequence", "string",      "true", "undefined", "upper",    "==",
      "!=",      "<",        ">",           "<=",   ">="};
  return k;
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  std::vector<Node> Template() {
    std::string end;
    std::vector<Node> body = Body({}, &end);
    return body;
  }

 private:
  const Token& Peek(size_t ahead = 0) const { return t_[std::min(i_ + ahead, t_.size() - 1)]; }
  bool IsOp(std::string_view op, size_t ahead = 0) const {
    return Peek(ahead).kind == T::kOp && Peek(ahead).text == op;
  }
  bool IsName(std::string_view name, size_t ahead = 0) const {
    return Peek(ahead).kind == T::kName && Peek(ahead).text == name;
  }
  [[noreturn]] void Unexpected(std::string_view wanted) const {
    const Token& tk = Peek();
    const std::string seen = tk.kind == T::kEof ? "the end" : absl::StrCat("'", tk.text, "'");
    Fail(absl::StrCat("expected ", std::string(wanted), " at ", tk.pos, ", found ", seen));
  }
  void ExpectOp(std::string_view op) {
    if (!IsOp(op)) Unexpected(absl::StrCat("'", std::string(op), "'"));
    ++i_;
  }
  std::string ExpectName() {
    if (Peek().kind != T::kName) Unexpected("a name");
    return t_[i_++].text;
  }
  void ExpectBlockEnd() {
    if (Peek().kind != T::kBlockEnd) Unexpected("'%}'");
    ++i_;
  }

  // Nodes up to a block tag whose keyword is one of `ends` (consumed with its "{%"; the rest of
  // that tag is the caller's), or to the end of the template when `ends` is empty.
  std::vector<Node> Body(std::initializer_list<std::string_view> ends, std::string* end) {
    const Nesting nesting(this);
    std::vector<Node> nodes;
    for (;;) {
      const Token& tk = Peek();
      if (tk.kind == T::kEof) {
        if (ends.size() != 0)
          Fail(absl::StrCat("missing {% ", std::string(*(ends.end() - 1)), " %}"));
        return nodes;
      }
      if (tk.kind == T::kText) {
        nodes.push_back(Node(Node::kText, tk.text));
        ++i_;
        continue;
      }
      if (tk.kind == T::kVarBegin) {
        ++i_;
        Node out(Node::kOutput);
        out.exprs.push_back(Expression());
        if (Peek().kind != T::kVarEnd) Unexpected("'}}'");
        ++i_;
        nodes.push_back(std::move(out));
        continue;
      }
      if (tk.kind != T::kBlockBegin) Unexpected("text or a tag");
      ++i_;
      const size_t at = Peek().pos;
      const std::string keyword = ExpectName();
      if (std::find(ends.begin(), ends.end(), keyword) != ends.end()) {
        *end = keyword;
        return nodes;
      }
      nodes.push_back(Statement(keyword, at));
    }
  }

  Node Statement(const std::string& keyword, size_t at) {
    std::string end;
    if (keyword == "if") {
      Node node(Node::kIf);
      node.exprs.push_back(Expression());
      ExpectBlockEnd();
      for (;;) {
        node.bodies.push_back(Body({"elif", "else", "endif"}, &end));
        if (end == "elif") {
          node.exprs.push_back(Expression());
          ExpectBlockEnd();
        } else if (end == "else") {
          ExpectBlockEnd();
          node.bodies.push_back(Body({"endif"}, &end));
          ExpectBlockEnd();
          return node;
        } else {
          ExpectBlockEnd();
          return node;
        }
      }
    }
    if (keyword == "for") {
      Node node(Node::kFor);
      node.targets.push_back(ExpectName());
      while (IsOp(",")) {
        ++i_;
        node.targets.push_back(ExpectName());
      }
      if (!IsName("in")) Unexpected("'in'");
      ++i_;
      node.exprs.push_back(Expression(/*conditional=*/false));
      if (IsName("if")) {
        ++i_;
        node.exprs.push_back(Expression());
      }
      if (IsName("recursive")) Fail(absl::StrCat("unsupported: recursive loops (at ", at, ")"));
      ExpectBlockEnd();
      ++loops_;
      node.bodies.push_back(Body({"else", "endfor"}, &end));
      --loops_;
      if (end == "else") {
        ExpectBlockEnd();
        node.bodies.push_back(Body({"endfor"}, &end));
      }
      ExpectBlockEnd();
      return node;
    }
    if (keyword == "set") {
      Node node(Node::kSet);
      node.text = ExpectName();
      if (IsOp(".")) {
        ++i_;
        node.attr = ExpectName();
      }
      if (IsOp("=")) {
        ++i_;
        node.exprs.push_back(Expression());
        ExpectBlockEnd();
        return node;
      }
      if (!node.attr.empty() || IsOp(","))
        Fail(absl::StrCat("unsupported: this set (at ", at, ")"));
      ExpectBlockEnd();
      node.kind = Node::kSetBlock;
      node.bodies.push_back(Body({"endset"}, &end));
      ExpectBlockEnd();
      return node;
    }
    if (keyword == "break" || keyword == "continue") {
      if (loops_ == 0) Fail(absl::StrCat("'", keyword, "' outside a loop at ", at));
      ExpectBlockEnd();
      return Node(keyword == "break" ? Node::kBreak : Node::kContinue);
    }
    if (keyword == "generation") {  // transformers' assistant-mask marker: renders its body
      ExpectBlockEnd();
      Node node(Node::kBlock);
      node.bodies.push_back(Body({"endgeneration"}, &end));
      ExpectBlockEnd();
      return node;
    }
    Fail(absl::StrCat("unsupported statement '{% ", keyword, " %}' at ", at));
  }

  ExprP Make(Expr::Kind kind, size_t pos) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->pos = pos;
    return e;
  }
  ExprP Make(Expr::Kind kind, size_t pos, ExprP a, ExprP b = nullptr) {
    ExprP e = Make(kind, pos);
    Push(e.get(), std::move(a));
    if (b != nullptr) Push(e.get(), std::move(b));
    return e;
  }
  // Adds an operand, keeping trees shallow enough for the recursive renderer (and destructor):
  // chains such as 1+1+...+1 are built iteratively but evaluated recursively.
  void Push(Expr* e, ExprP child) {
    if (child != nullptr) e->depth = std::max(e->depth, child->depth + 1);
    if (e->depth > kMaxExprDepth) Fail(absl::StrCat("expression nested too deeply at ", e->pos));
    e->args.push_back(std::move(child));
  }
  static constexpr int kMaxExprDepth = 100;

  ExprP Expression(bool conditional = true) {
    const Nesting nesting(this);
    ExprP e = Or();
    if (conditional && IsName("if")) {
      const size_t pos = Peek().pos;
      ++i_;
      ExprP cond = Or();
      ExprP c = Make(Expr::kCond, pos, std::move(cond), std::move(e));
      if (IsName("else")) {
        ++i_;
        Push(c.get(), Expression());
      }
      return c;
    }
    return e;
  }
  ExprP Or() {
    ExprP e = And();
    while (IsName("or")) {
      const size_t pos = t_[i_++].pos;
      e = Make(Expr::kOr, pos, std::move(e), And());
    }
    return e;
  }
  ExprP And() {
    ExprP e = Not();
    while (IsName("and")) {
      const size_t pos = t_[i_++].pos;
      e = Make(Expr::kAnd, pos, std::move(e), Not());
    }
    return e;
  }
  ExprP Not() {
    const Nesting nesting(this);
    if (IsName("not")) {
      const size_t pos = t_[i_++].pos;
      return Make(Expr::kNot, pos, Not());
    }
    return Compare();
  }
  ExprP Compare() {
    ExprP e = Math1();
    for (;;) {
      const size_t pos = Peek().pos;
      std::string op;
      if (Peek().kind == T::kOp &&
          (IsOp("==") || IsOp("!=") || IsOp("<") || IsOp(">") || IsOp("<=") || IsOp(">="))) {
        op = t_[i_++].text;
      } else if (IsName("in")) {
        ++i_;
        op = "in";
      } else if (IsName("not") && IsName("in", 1)) {
        i_ += 2;
        op = "not in";
      } else {
        return e;
      }
      e = Make(Expr::kBinary, pos, std::move(e), Math1());
      e->name = op;
    }
  }
  ExprP Binary(ExprP (Parser::*next)(), std::initializer_list<std::string_view> ops) {
    ExprP e = (this->*next)();
    for (;;) {
      const Token& tk = Peek();
      if (tk.kind != T::kOp || std::find(ops.begin(), ops.end(), tk.text) == ops.end()) return e;
      ++i_;
      e = Make(Expr::kBinary, tk.pos, std::move(e), (this->*next)());
      e->name = tk.text;
    }
  }
  ExprP Math1() { return Binary(&Parser::Concat, {"+", "-"}); }
  ExprP Concat() { return Binary(&Parser::Math2, {"~"}); }
  ExprP Math2() { return Binary(&Parser::Pow, {"*", "/", "//", "%"}); }
  ExprP Pow() { return Binary(&Parser::Operand, {"**"}); }
  ExprP Operand() { return Unary(); }
  // jinja2's parse_unary: a sign applies to the operand before its filters (-5|abs is 5).
  ExprP Unary(bool with_filter = true) {
    const Nesting nesting(this);
    ExprP e;
    if (IsOp("-") || IsOp("+")) {
      const bool minus = IsOp("-");
      const size_t pos = t_[i_++].pos;
      e = Unary(/*with_filter=*/false);
      if (minus) e = Make(Expr::kNeg, pos, std::move(e));
    } else {
      e = Primary();
    }
    e = Postfix(std::move(e));
    if (with_filter) e = FilterTail(std::move(e));
    return e;
  }

  ExprP Primary() {
    const Token& tk = Peek();
    const size_t pos = tk.pos;
    if (tk.kind == T::kString) {
      std::string s;
      while (Peek().kind == T::kString) s += t_[i_++].text;  // adjacent literals join
      ExprP e = Make(Expr::kLiteral, pos);
      e->literal = s;
      return e;
    }
    if (tk.kind == T::kNumber) {
      ExprP e = Make(Expr::kLiteral, pos);
      e->literal = tk.number;
      ++i_;
      return e;
    }
    if (tk.kind == T::kName) {
      ++i_;
      ExprP e = Make(Expr::kLiteral, pos);
      if (tk.text == "true" || tk.text == "True") {
        e->literal = true;
      } else if (tk.text == "false" || tk.text == "False") {
        e->literal = false;
      } else if (tk.text == "none" || tk.text == "None") {
        e->literal = nullptr;
      } else {
        e->kind = Expr::kName;
        e->name = tk.text;
      }
      return e;
    }
    if (IsOp("(")) {
      ++i_;
      if (IsOp(")")) {
        ++i_;
        return Make(Expr::kList, pos);
      }
      ExprP e = Expression();
      if (IsOp(",")) {  // a tuple
        ExprP list = Make(Expr::kList, pos, std::move(e));
        while (IsOp(",")) {
          ++i_;
          if (IsOp(")")) break;
          Push(list.get(), Expression());
        }
        e = std::move(list);
      }
      ExpectOp(")");
      return e;
    }
    if (IsOp("[")) {
      ++i_;
      ExprP list = Make(Expr::kList, pos);
      while (!IsOp("]")) {
        Push(list.get(), Expression());
        if (!IsOp(",")) break;
        ++i_;
      }
      ExpectOp("]");
      return list;
    }
    if (IsOp("{")) {
      ++i_;
      ExprP dict = Make(Expr::kDict, pos);
      while (!IsOp("}")) {
        Push(dict.get(), Expression());
        ExpectOp(":");
        Push(dict.get(), Expression());
        if (!IsOp(",")) break;
        ++i_;
      }
      ExpectOp("}");
      return dict;
    }
    Unexpected("an expression");
  }

  ExprP Postfix(ExprP e) {
    for (;;) {
      const size_t pos = Peek().pos;
      if (IsOp(".")) {
        ++i_;
        if (Peek().kind == T::kNumber) {
          ExprP key = Make(Expr::kLiteral, pos);
          key->literal = t_[i_++].number;
          e = Make(Expr::kItem, pos, std::move(e), std::move(key));
        } else {
          ExprP attr = Make(Expr::kAttr, pos, std::move(e));
          attr->name = ExpectName();
          e = std::move(attr);
        }
      } else if (IsOp("[")) {
        ++i_;
        ExprP parts[3];
        int colons = 0;
        while (!IsOp("]")) {
          if (IsOp(":")) {
            if (++colons > 2) Unexpected("']'");
            ++i_;
            continue;
          }
          if (parts[colons] != nullptr) Unexpected("':' or ']'");
          parts[colons] = Expression();
        }
        ++i_;
        if (colons == 0) {
          if (parts[0] == nullptr) Unexpected("an index");
          e = Make(Expr::kItem, pos, std::move(e), std::move(parts[0]));
        } else {
          ExprP slice = Make(Expr::kSlice, pos, std::move(e));
          for (ExprP& p : parts) Push(slice.get(), std::move(p));
          e = std::move(slice);
        }
      } else if (IsOp("(")) {
        static const std::set<std::string, std::less<>> kMethods = {
            "strip",      "lstrip", "rstrip",     "upper",    "lower",   "title",
            "capitalize", "split",  "startswith", "endswith", "replace", "find",
            "join",       "items",  "keys",       "values",   "get"};
        static const std::set<std::string, std::less<>> kFunctions = {
            "range", "namespace", "dict", "raise_exception", "strftime_now"};
        if (e->kind == Expr::kAttr && kMethods.count(e->name) == 0) {
          Fail(absl::StrCat("unsupported method '", e->name, "()' at ", pos));
        }
        if (e->kind == Expr::kName && kFunctions.count(e->name) == 0) {
          Fail(absl::StrCat("unsupported function '", e->name, "()' at ", pos));
        }
        ExprP call = Make(Expr::kCall, pos, std::move(e));
        Arguments(call.get());
        e = std::move(call);
      } else {
        return e;
      }
    }
  }

  // "(a, b, k=v)" into e->args (after what is there) and e->kwargs.
  void Arguments(Expr* e) {
    ExpectOp("(");
    while (!IsOp(")")) {
      if (Peek().kind == T::kName && IsOp("=", 1)) {
        std::string key = t_[i_].text;
        i_ += 2;
        ExprP value = Expression();
        e->depth = std::max(e->depth, value->depth + 1);
        if (e->depth > kMaxExprDepth)
          Fail(absl::StrCat("expression nested too deeply at ", e->pos));
        e->kwargs.emplace_back(std::move(key), std::move(value));
      } else {
        Push(e, Expression());
      }
      if (!IsOp(",")) break;
      ++i_;
    }
    ExpectOp(")");
  }

  ExprP FilterTail(ExprP e) {
    for (;;) {
      const size_t pos = Peek().pos;
      if (IsOp("|")) {
        ++i_;
        ExprP f = Make(Expr::kFilter, pos, std::move(e));
        f->name = ExpectName();
        if (Filters().count(f->name) == 0) {
          Fail(absl::StrCat("unsupported filter '", f->name, "' at ", pos));
        }
        if (IsOp("(")) Arguments(f.get());
        e = std::move(f);
      } else if (IsName("is")) {
        ++i_;
        ExprP test = Make(Expr::kTest, pos, std::move(e));
        if (IsName("not")) {
          ++i_;
          test->negated = true;
        }
        if (Peek().kind == T::kName || (Peek().kind == T::kOp && Tests().count(Peek().text))) {
          test->name = t_[i_++].text;
        } else {
          Unexpected("a test name");
        }
        if (Tests().count(test->name) == 0) {
          Fail(absl::StrCat("unsupported test '", test->name, "' at ", pos));
        }
        if (IsOp("(")) {
          Arguments(test.get());
        } else if (Peek().kind == T::kString || Peek().kind == T::kNumber ||
                   (Peek().kind == T::kName && !IsName("and") && !IsName("or") && !IsName("if") &&
                    !IsName("else") && !IsName("in") && !IsName("is") && !IsName("not"))) {
          Push(test.get(), Postfix(Primary()));
        }
        e = std::move(test);
      } else {
        return e;
      }
    }
  }

  // Bounds the recursion (and so the renderer's, which follows the tree): a template from a
  // corrupt or hostile model file is refused, not a stack overflow.
  struct Nesting {
    explicit Nesting(Parser* p) : parser(p) {
      if (++parser->depth_ > 200) Fail("nested too deeply (over 200 levels)");
    }
    ~Nesting() { --parser->depth_; }
    Parser* parser;
  };

  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;
  int loops_ = 0;  // for loops around the statement being parsed
};

// ---------------------------------------------------------------------------------------------
// Values

// A value shares its JSON (a name's lookup copies no data); only a namespace is ever changed
// in place, so variables naming the same namespace see its changes, as in Python.
struct Value {
  std::shared_ptr<json> p;  // null when undefined
  bool undefined = false;
  bool ns = false;    // made by namespace(): attributes may be set
  bool lazy = false;  // what jinja2 returns as a generator (select, map, ...): always true
  const json& j() const {
    static const json kNull;
    return p ? *p : kNull;
  }
};

// jinja2 returns a generator from select, reject, map and reverse: always true, no length.
Value Lazy(Value v) {
  v.lazy = true;
  return v;
}

Value Undefined() {
  Value v;
  v.undefined = true;
  return v;
}
Value Of(json j) {
  Value v;
  v.p = std::make_shared<json>(std::move(j));
  return v;
}

// Any one string or list a template builds is at most this big; what all its operations build
// together is bounded by Renderer::kMaxBytes.
constexpr size_t kMaxValue = size_t{16} << 20;
void CheckSize(size_t bytes) {
  if (bytes > kMaxValue) Fail("a value of the template grows past 16 MB");
}

// Offsets of the code points of s, and s.size() last.
std::vector<size_t> CodePoints(const std::string& s) {
  std::vector<size_t> at;
  for (size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) at.push_back(i);
  }
  at.push_back(s.size());
  return at;
}

std::string TypeName(const Value& v) {
  if (v.undefined) return "undefined";
  switch (v.j().type()) {
    case json::value_t::null:
      return "none";
    case json::value_t::boolean:
      return "bool";
    case json::value_t::string:
      return "string";
    case json::value_t::array:
      return "list";
    case json::value_t::object:
      return "dict";
    case json::value_t::number_float:
      return "float";
    default:
      return "int";
  }
}

bool Truthy(const Value& v) {
  if (v.undefined) return false;
  if (v.lazy) return true;
  const json& j = v.j();
  switch (j.type()) {
    case json::value_t::null:
      return false;
    case json::value_t::boolean:
      return j.get<bool>();
    case json::value_t::string:
      return !j.get_ref<const std::string&>().empty();
    case json::value_t::array:
    case json::value_t::object:
      return !j.empty();
    case json::value_t::number_float:
      return j.get<double>() != 0;
    default:
      return j.get<int64_t>() != 0;
  }
}

bool IsInt(const json& j) { return j.is_number_integer(); }
// Python's numbers: bool is an int there.
bool Numeric(const json& j) { return j.is_number() || j.is_boolean(); }
int64_t AsInt(const json& j) {
  if (j.is_boolean()) return j.get<bool>() ? 1 : 0;
  if (j.is_number_unsigned() && j.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    Fail("an integer over 2^63");
  }
  return j.get<int64_t>();
}
double AsDouble(const json& j) {
  return j.is_boolean() ? (j.get<bool>() ? 1.0 : 0.0) : j.get<double>();
}

// Python's repr of a float: the shortest text that reads back, with ".0" on integral values.
std::string FloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  // The shortest digits that read back, as d.ddde[+-]X.
  char buf[40];
  for (int precision = 0; precision <= 16; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*e", precision, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  std::string text = buf;
  const size_t e = text.find('e');
  const int exponent = std::atoi(text.c_str() + e + 1);
  std::string digits;
  for (size_t i = 0; i < e; ++i) {
    if (IsDigit(text[i])) digits += text[i];
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  const std::string sign = d < 0 || (d == 0 && std::signbit(d)) ? "-" : "";
  if (exponent < -4 || exponent >= 16) {  // Python's repr: 1e+16, 1.5e-07
    std::string m = digits.substr(0, 1);
    if (digits.size() > 1) m += "." + digits.substr(1);
    char ebuf[16];
    std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    return sign + m + ebuf;
  }
  if (exponent < 0)
    return sign + "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
  const size_t point = static_cast<size_t>(exponent) + 1;
  if (digits.size() <= point) return sign + digits + std::string(point - digits.size(), '0') + ".0";
  return sign + digits.substr(0, point) + "." + digits.substr(point);
}

std::string Repr(const json& j);

// Python's str() of a value, as {{ }} prints it.
std::string Str(const Value& v) {
  if (v.undefined) return "";
  const json& j = v.j();
  switch (j.type()) {
    case json::value_t::string:
      return j.get<std::string>();
    case json::value_t::null:
      return "None";
    case json::value_t::boolean:
      return j.get<bool>() ? "True" : "False";
    case json::value_t::number_float:
      return FloatRepr(j.get<double>());
    case json::value_t::array:
    case json::value_t::object:
      return Repr(j);
    case json::value_t::number_unsigned:
      return std::to_string(j.get<uint64_t>());
    default:
      return std::to_string(j.get<int64_t>());
  }
}

// Python's repr() of a value (strings quoted), as str() prints list and dict members.
std::string Repr(const json& j) {
  if (j.is_string()) {
    const std::string& s = j.get_ref<const std::string&>();
    const char quote =
        s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
    std::string out(1, quote);
    for (const char c : s) {
      if (c == quote || c == '\\') {
        out += '\\';
        out += c;
      } else if (c == '\n') {
        out += "\\n";
      } else if (c == '\r') {
        out += "\\r";
      } else if (c == '\t') {
        out += "\\t";
      } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
        char buf[8];
        std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned char>(c));
        out += buf;
      } else {
        out += c;
      }
    }
    return out + quote;
  }
  if (j.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < j.size(); ++i) out += (i ? ", " : "") + Repr(j[i]);
    return out + "]";
  }
  if (j.is_object()) {
    std::string out = "{";
    bool first = true;
    for (auto it = j.begin(); it != j.end(); ++it) {
      out += (first ? "" : ", ") + Repr(json(it.key())) + ": " + Repr(it.value());
      first = false;
    }
    return out + "}";
  }
  return Str(Of(j));
}

// Python's json.dumps options: item and key separators (", " and ": "; "," with an indent),
// the indent (pretty: a newline and the indent per level), ensure_ascii, sort_keys.
struct DumpStyle {
  bool ascii = false, sort = false, pretty = false;
  std::string indent, item = ", ", key = ": ";
};

void Dumps(const json& j, const DumpStyle& style, int depth, std::string* out) {
  auto newline = [&](int d) {
    if (!style.pretty) return;
    *out += '\n';
    for (int k = 0; k < d; ++k) *out += style.indent;
  };
  const bool ascii = style.ascii;
  switch (j.type()) {
    case json::value_t::string: {
      *out += '"';
      const std::string& s = j.get_ref<const std::string&>();
      for (size_t i = 0; i < s.size(); ++i) {
        const unsigned char c = static_cast<unsigned char>(s[i]);
        char buf[16];
        if (c == '"' || c == '\\') {
          *out += '\\';
          *out += static_cast<char>(c);
        } else if (c == '\n') {
          *out += "\\n";
        } else if (c == '\r') {
          *out += "\\r";
        } else if (c == '\t') {
          *out += "\\t";
        } else if (c == '\b') {
          *out += "\\b";
        } else if (c == '\f') {
          *out += "\\f";
        } else if (c < 0x20 || (ascii && c == 0x7f)) {
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          *out += buf;
        } else if (ascii && c >= 0x80) {
          uint32_t cp = 0;
          int more = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1;
          cp = c & (0x3F >> more);
          for (int k = 0; k < more && i + 1 < s.size(); ++k) cp = cp << 6 | (s[++i] & 0x3F);
          if (cp >= 0x10000) {
            cp -= 0x10000;
            std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", 0xD800 + (cp >> 10),
                          0xDC00 + (cp & 0x3FF));
          } else {
            std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
          }
          *out += buf;
        } else {
          *out += static_cast<char>(c);
        }
      }
      *out += '"';
      return;
    }
    case json::value_t::array:
      if (j.empty()) {
        *out += "[]";
        return;
      }
      *out += '[';
      for (size_t i = 0; i < j.size(); ++i) {
        if (i) *out += style.item;
        newline(depth + 1);
        Dumps(j[i], style, depth + 1, out);
        CheckSize(out->size());
      }
      newline(depth);
      *out += ']';
      return;
    case json::value_t::object: {
      if (j.empty()) {
        *out += "{}";
        return;
      }
      std::vector<std::string> keys;
      for (auto it = j.begin(); it != j.end(); ++it) keys.push_back(it.key());
      if (style.sort) std::sort(keys.begin(), keys.end());
      *out += '{';
      for (size_t i = 0; i < keys.size(); ++i) {
        if (i) *out += style.item;
        newline(depth + 1);
        Dumps(json(keys[i]), style, depth + 1, out);
        *out += style.key;
        Dumps(j.at(keys[i]), style, depth + 1, out);
        CheckSize(out->size());
      }
      newline(depth);
      *out += '}';
      return;
    }
    case json::value_t::null:
      *out += "null";
      return;
    case json::value_t::boolean:
      *out += j.get<bool>() ? "true" : "false";
      return;
    case json::value_t::number_float: {
      const double d = j.get<double>();
      *out += std::isnan(d)   ? "NaN"
              : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                              : FloatRepr(d);
      return;
    }
    default:
      *out += Str(Of(j));
      return;
  }
}

// The length of the Unicode whitespace character (Python's str.isspace) at s[i], or 0.
size_t SpaceAt(const std::string& s, size_t i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  if (IsSpace(static_cast<char>(c)) || (c >= 0x1c && c <= 0x1f)) return 1;
  if (c == 0xC2 && i + 1 < s.size()) {  // U+0085, U+00A0
    const unsigned char d = static_cast<unsigned char>(s[i + 1]);
    return d == 0x85 || d == 0xA0 ? 2 : 0;
  }
  if (i + 2 >= s.size()) return 0;
  const unsigned char d = static_cast<unsigned char>(s[i + 1]),
                      f = static_cast<unsigned char>(s[i + 2]);
  if (c == 0xE1 && d == 0x9A && f == 0x80) return 3;  // U+1680
  if (c == 0xE2 && d == 0x80 && ((f >= 0x80 && f <= 0x8A) || f == 0xA8 || f == 0xA9 || f == 0xAF)) {
    return 3;  // U+2000..200A, U+2028, U+2029, U+202F
  }
  if (c == 0xE2 && d == 0x81 && f == 0x9F) return 3;  // U+205F
  if (c == 0xE3 && d == 0x80 && f == 0x80) return 3;  // U+3000
  return 0;
}

// Python's str.strip/lstrip/rstrip: Unicode whitespace, or the code points of `chars`.
std::string StripChars(const std::string& s, const std::string* chars, bool left, bool right) {
  const std::vector<size_t> at = CodePoints(s);
  const size_t n = at.size() - 1;
  auto strip = [&](size_t k) {
    const size_t len = at[k + 1] - at[k];
    if (chars == nullptr) return SpaceAt(s, at[k]) == len;
    const std::string cp = s.substr(at[k], len);
    for (size_t q = 0; q + len <= chars->size(); ++q) {
      if (chars->compare(q, len, cp) == 0 &&
          ((static_cast<unsigned char>((*chars)[q]) & 0xC0) != 0x80))
        return true;
    }
    return false;
  };
  size_t b = 0, e = n;
  if (left) {
    while (b < e && strip(b)) ++b;
  }
  if (right) {
    while (e > b && strip(e - 1)) --e;
  }
  return s.substr(at[b], at[e] - at[b]);
}

std::string Title(const std::string& s, bool only_first) {
  std::string out = s;
  bool start = true;
  for (char& c : out) {
    const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    if (start && letter) {
      if (c >= 'a') c = static_cast<char>(c - 32);
    } else if (letter || !only_first) {
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
    }
    start = only_first ? false : !letter;
  }
  return out;
}

std::string Case(std::string s, bool upper) {
  for (char& c : s) {
    if (upper && c >= 'a' && c <= 'z') c = static_cast<char>(c - 32);
    if (!upper && c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
  }
  return s;
}

// ---------------------------------------------------------------------------------------------
// Renderer

class Renderer {
 public:
  explicit Renderer(const json& variables) {
    scopes_.emplace_back();
    for (auto it = variables.begin(); it != variables.end(); ++it) {
      scopes_[0][it.key()] = Of(it.value());
    }
  }

  enum class Flow { kNormal, kBreak, kContinue };

  Flow Exec(const std::vector<Node>& body, std::string* out) {
    for (const Node& node : body) {
      // A template that loops without end (nested ranges) or grows its output without bound
      // is stopped, not left to hold a request thread.
      if (++steps_ > kMaxSteps || out->size() > kMaxOutput) {
        Fail("the template runs too long (over a million steps or 16 MB of output)");
      }
      Flow flow = Flow::kNormal;
      switch (node.kind) {
        case Node::kText:
          out->append(node.text);
          break;
        case Node::kOutput:
          out->append(Str(Eval(*node.exprs[0])));
          break;
        case Node::kIf: {
          size_t i = 0;
          while (i < node.exprs.size() && !Truthy(Eval(*node.exprs[i]))) ++i;
          if (i < node.bodies.size()) flow = Exec(node.bodies[i], out);
          break;
        }
        case Node::kFor:
          For(node, out);
          break;
        case Node::kSet: {
          Value v = Eval(*node.exprs[0]);
          if (node.attr.empty()) {
            scopes_.back()[node.text] = std::move(v);
          } else {
            Value* ns = Lookup(node.text);
            if (ns == nullptr || !ns->ns) {
              Fail(absl::StrCat("cannot set '", node.text, ".", node.attr, "': '", node.text,
                                "' is not a namespace"));
            }
            (*ns->p)[node.attr] = v.j();
          }
          break;
        }
        case Node::kSetBlock: {
          std::string s;
          scopes_.emplace_back();  // what the block sets stays inside it
          Exec(node.bodies[0], &s);
          scopes_.pop_back();
          scopes_.back()[node.text] = Of(s);
          break;
        }
        case Node::kBreak:
          return Flow::kBreak;
        case Node::kContinue:
          return Flow::kContinue;
        case Node::kBlock:
          flow = Exec(node.bodies[0], out);
          break;
      }
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

 private:
  Value* Lookup(const std::string& name) {
    for (auto s = scopes_.rbegin(); s != scopes_.rend(); ++s) {
      auto it = s->find(name);
      if (it != s->end()) return &it->second;
    }
    return nullptr;
  }

  static std::vector<json> Items(const Value& v) {
    if (v.undefined) return {};
    if (v.j().is_null()) Fail("none is not iterable");
    if (v.j().is_array()) return std::vector<json>(v.j().begin(), v.j().end());
    std::vector<json> items;
    if (v.j().is_object()) {
      for (auto it = v.j().begin(); it != v.j().end(); ++it) items.emplace_back(it.key());
      return items;
    }
    if (v.j().is_string()) {
      const std::string& s = v.j().get_ref<const std::string&>();
      const std::vector<size_t> at = CodePoints(s);
      for (size_t i = 0; i + 1 < at.size(); ++i)
        items.emplace_back(s.substr(at[i], at[i + 1] - at[i]));
      return items;
    }
    Fail(absl::StrCat("cannot iterate over a ", TypeName(v)));
  }

  void Bind(const std::vector<std::string>& targets, const json& item) {
    auto& scope = scopes_.back();
    if (targets.size() == 1) {
      scope[targets[0]] = Of(item);
      return;
    }
    if (!item.is_array() || item.size() != targets.size()) {
      Fail(absl::StrCat("cannot unpack ", Repr(item), " into ", targets.size(), " names"));
    }
    for (size_t k = 0; k < targets.size(); ++k) scope[targets[k]] = Of(item[k]);
  }

  void For(const Node& node, std::string* out) {
    std::vector<json> items = Items(Eval(*node.exprs[0]));
    if (node.exprs.size() > 1) {  // for x in xs if cond
      std::vector<json> kept;
      for (json& item : items) {
        if (++steps_ > kMaxSteps) Fail("the template runs too long (over a million steps)");
        scopes_.emplace_back();
        Bind(node.targets, item);
        const bool keep = Truthy(Eval(*node.exprs[1]));
        scopes_.pop_back();
        if (keep) kept.push_back(std::move(item));
      }
      items.swap(kept);
    }
    if (items.empty()) {
      if (node.bodies.size() > 1) Exec(node.bodies[1], out);
      return;
    }
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      scopes_.emplace_back();
      Bind(node.targets, items[i]);
      json loop = {{"index", i + 1},        {"index0", i}, {"first", i == 0},
                   {"last", i == n - 1},    {"length", n}, {"revindex", n - i},
                   {"revindex0", n - i - 1}};
      if (i > 0) loop["previtem"] = items[i - 1];
      if (i + 1 < n) loop["nextitem"] = items[i + 1];
      scopes_.back()["loop"] = Of(std::move(loop));
      const Flow flow = Exec(node.bodies[0], out);
      scopes_.pop_back();
      if (flow == Flow::kBreak) break;
    }
  }

  // Every value an operation builds counts against kMaxBytes, so no template holds or churns
  // unbounded memory (each value alone is bounded by kMaxValue where it is built).
  Value Eval(const Expr& e) {
    Value v = Compute(e);
    if (e.kind != Expr::kLiteral && e.kind != Expr::kName && e.kind != Expr::kAttr && v.p) {
      const json& j = v.j();
      made_ += j.is_string()       ? j.get_ref<const std::string&>().size()
               : j.is_structured() ? j.size() * 16
                                   : 8;
      if (made_ > kMaxBytes) Fail("the template builds over 256 MB of values");
    }
    return v;
  }

  Value Compute(const Expr& e) {
    switch (e.kind) {
      case Expr::kLiteral:
        return Of(e.literal);
      case Expr::kName: {
        Value* v = Lookup(e.name);
        return v != nullptr ? *v : Undefined();
      }
      case Expr::kAttr:
        return Attribute(Eval(*e.args[0]), e.name);
      case Expr::kItem:
        return Item(Eval(*e.args[0]), Eval(*e.args[1]));
      case Expr::kSlice:
        return Slice(e);
      case Expr::kCall:
        return Call(e);
      case Expr::kFilter:
        return Filter(e);
      case Expr::kTest: {
        const bool r =
            Test(e.name, Eval(*e.args[0]), e.args.size() > 1 ? Eval(*e.args[1]) : Undefined());
        return Of(r != e.negated);
      }
      case Expr::kNeg: {
        const Value v = Eval(*e.args[0]);
        if (!v.undefined && IsInt(v.j())) {
          const int64_t n = AsInt(v.j());
          if (n == INT64_MIN) Fail(absl::StrCat("integer overflow in '-' (at ", e.pos, ")"));
          return Of(-n);
        }
        if (!v.undefined && v.j().is_number()) return Of(-v.j().get<double>());
        Fail(absl::StrCat("cannot negate a ", TypeName(v), " (at ", e.pos, ")"));
      }
      case Expr::kBinary:
        return BinaryOp(e.name, Eval(*e.args[0]), Eval(*e.args[1]), e.pos);
      case Expr::kAnd: {
        Value a = Eval(*e.args[0]);
        return Truthy(a) ? Eval(*e.args[1]) : a;
      }
      case Expr::kOr: {
        Value a = Eval(*e.args[0]);
        return Truthy(a) ? a : Eval(*e.args[1]);
      }
      case Expr::kNot:
        return Of(!Truthy(Eval(*e.args[0])));
      case Expr::kCond:
        if (Truthy(Eval(*e.args[0]))) return Eval(*e.args[1]);
        return e.args.size() > 2 ? Eval(*e.args[2]) : Undefined();
      case Expr::kList: {
        json list = json::array();
        for (const ExprP& a : e.args) list.push_back(Eval(*a).j());
        return Of(std::move(list));
      }
      case Expr::kDict: {
        json dict = json::object();
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          dict[Str(Eval(*e.args[k]))] = Eval(*e.args[k + 1]).j();
        }
        return Of(std::move(dict));
      }
    }
    Fail("bad expression");
  }

  static Value Attribute(const Value& v, const std::string& name) {
    if (v.undefined) Fail(absl::StrCat("'", name, "' of an undefined value"));
    if (v.j().is_object()) {
      auto it = v.j().find(name);
      return it != v.j().end() ? Of(*it) : Undefined();
    }
    return Undefined();
  }

  static Value Item(const Value& v, const Value& key) {
    if (v.undefined) Fail("an item of an undefined value");
    if (key.undefined || v.lazy) return Undefined();
    if (v.j().is_object())
      return key.j().is_string() ? Attribute(v, key.j().get<std::string>()) : Undefined();
    if (!IsInt(key.j())) return Undefined();
    int64_t i = key.j().get<int64_t>();
    if (v.j().is_array()) {
      const int64_t n = static_cast<int64_t>(v.j().size());
      if (i < 0) i += n;
      return i >= 0 && i < n ? Of(v.j()[static_cast<size_t>(i)]) : Undefined();
    }
    if (v.j().is_string()) {
      const std::string& s = v.j().get_ref<const std::string&>();
      const std::vector<size_t> at = CodePoints(s);
      const int64_t n = static_cast<int64_t>(at.size()) - 1;
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Undefined();
      return Of(s.substr(at[i], at[i + 1] - at[i]));
    }
    return Undefined();
  }

  Value Slice(const Expr& e) {
    const Value v = Eval(*e.args[0]);
    auto part = [&](int k) -> std::optional<int64_t> {
      if (e.args[k] == nullptr) return std::nullopt;
      const Value p = Eval(*e.args[k]);
      if (p.undefined || p.j().is_null()) return std::nullopt;
      if (!IsInt(p.j())) Fail(absl::StrCat("slice indices must be integers (at ", e.pos, ")"));
      return p.j().get<int64_t>();
    };
    const std::optional<int64_t> start = part(1), stop = part(2), step_opt = part(3);
    const int64_t step = step_opt.value_or(1);
    if (step == 0) Fail("slice step cannot be zero");
    std::vector<json> items;
    const bool text = !v.undefined && v.j().is_string();
    if (text || (!v.undefined && v.j().is_array())) {
      items = Items(v);
    } else {
      Fail(absl::StrCat("cannot slice a ", TypeName(v), " (at ", e.pos, ")"));
    }
    // Python's slice.indices.
    const int64_t n = static_cast<int64_t>(items.size());
    auto clamp = [&](std::optional<int64_t> x, int64_t dflt) {
      if (!x) return dflt;
      int64_t i = *x < 0 ? *x + n : *x;
      if (step > 0) return std::clamp<int64_t>(i, 0, n);
      return std::clamp<int64_t>(i, -1, n - 1);
    };
    const int64_t b = clamp(start, step > 0 ? 0 : n - 1), s = clamp(stop, step > 0 ? n : -1);
    json out = json::array();
    std::string str;
    for (int64_t i = b; step > 0 ? i < s : i > s;) {
      if (text) {
        str += items[static_cast<size_t>(i)].get<std::string>();
      } else {
        out.push_back(items[static_cast<size_t>(i)]);
      }
      // The next index, unless it is past the end (compared without overflowing).
      const uint64_t left = step > 0 ? static_cast<uint64_t>(s - i) : static_cast<uint64_t>(i - s);
      const uint64_t stride =
          step > 0 ? static_cast<uint64_t>(step) : 0 - static_cast<uint64_t>(step);
      if (left <= stride) break;
      i += step;
    }
    return text ? Of(str) : Of(std::move(out));
  }

  std::vector<Value> Args(const Expr& e, size_t from) {
    std::vector<Value> args;
    for (size_t k = from; k < e.args.size(); ++k) args.push_back(Eval(*e.args[k]));
    return args;
  }
  std::map<std::string, Value> Kwargs(const Expr& e) {
    std::map<std::string, Value> kwargs;
    for (const auto& [key, value] : e.kwargs) kwargs[key] = Eval(*value);
    return kwargs;
  }

  Value Call(const Expr& e) {
    const Expr& callee = *e.args[0];
    std::vector<Value> args = Args(e, 1);
    std::map<std::string, Value> kwargs = Kwargs(e);
    auto arg = [&](size_t k, const char* key) -> const Value* {
      if (k < args.size()) return &args[k];
      auto it = kwargs.find(key);
      return it != kwargs.end() ? &it->second : nullptr;
    };
    if (callee.kind == Expr::kAttr) return Method(Eval(*callee.args[0]), callee.name, args, e.pos);
    if (callee.kind != Expr::kName) Fail(absl::StrCat("cannot call this (at ", e.pos, ")"));
    const std::string& f = callee.name;
    if (f == "raise_exception") {
      Fail(args.empty() ? std::string("raise_exception") : Str(args[0]));
    }
    if (f == "range") {
      int64_t a = 0, b = 0, step = 1;
      for (const Value& v : args) {
        if (v.undefined || !IsInt(v.j())) Fail("range: arguments must be integers");
      }
      if (args.size() == 1) {
        b = args[0].j().get<int64_t>();
      } else if (args.size() >= 2) {
        a = args[0].j().get<int64_t>();
        b = args[1].j().get<int64_t>();
        if (args.size() > 2) step = args[2].j().get<int64_t>();
      }
      if (step == 0) Fail("range: step is zero");
      json out = json::array();
      for (int64_t i = a; step > 0 ? i < b : i > b; i += step) {
        out.push_back(i);
        if (out.size() > 1000000) Fail("range: too long");
      }
      return Of(std::move(out));
    }
    if (f == "namespace" || f == "dict") {
      json obj = json::object();
      if (!args.empty() && args[0].j().is_object()) obj = args[0].j();
      for (const auto& kw : e.kwargs) obj[kw.first] = kwargs.at(kw.first).j();  // in order
      Value v = Of(std::move(obj));
      v.ns = f == "namespace";
      return v;
    }
    if (f == "strftime_now") {
      const Value* fmt = arg(0, "format");
      if (fmt == nullptr || !fmt->j().is_string()) Fail("strftime_now: takes a format string");
      const std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[256];
      const size_t len = std::strftime(buf, sizeof(buf), fmt->j().get<std::string>().c_str(), &tm);
      return Of(std::string(buf, len));
    }
    Fail(absl::StrCat("unknown function '", f, "' (at ", e.pos, ")"));
  }

  static Value Method(const Value& self, const std::string& name, const std::vector<Value>& args,
                      size_t pos) {
    auto str_arg = [&](size_t k) -> const std::string* {
      return k < args.size() && args[k].j().is_string() ? &args[k].j().get_ref<const std::string&>()
                                                        : nullptr;
    };
    if (!self.undefined && self.j().is_string()) {
      const std::string& s = self.j().get_ref<const std::string&>();
      if (name == "strip") return Of(StripChars(s, str_arg(0), true, true));
      if (name == "lstrip") return Of(StripChars(s, str_arg(0), true, false));
      if (name == "rstrip") return Of(StripChars(s, str_arg(0), false, true));
      if (name == "upper" || name == "lower") return Of(Case(s, name == "upper"));
      if (name == "title") return Of(Title(s, false));
      if (name == "capitalize") return Of(Title(s, true));
      if (name == "startswith" || name == "endswith") {
        std::vector<std::string> options;
        if (!args.empty() && args[0].j().is_array()) {
          for (const json& o : args[0].j())
            options.push_back(o.is_string() ? o.get<std::string>() : "");
        } else if (const std::string* o = str_arg(0)) {
          options.push_back(*o);
        } else {
          Fail(absl::StrCat(name, ": takes a string (at ", pos, ")"));
        }
        for (const std::string& o : options) {
          const bool hit =
              name == "startswith"
                  ? s.compare(0, o.size(), o) == 0
                  : s.size() >= o.size() && s.compare(s.size() - o.size(), o.size(), o) == 0;
          if (hit) return Of(true);
        }
        return Of(false);
      }
      if (name == "split") {
        json out = json::array();
        const std::string* sep = str_arg(0);
        int64_t max = args.size() > 1 && IsInt(args[1].j()) ? args[1].j().get<int64_t>() : -1;
        if (sep == nullptr) {  // runs of whitespace, no empty parts
          size_t i = 0;
          while (i < s.size()) {
            while (i < s.size() && SpaceAt(s, i) > 0) i += SpaceAt(s, i);
            if (i >= s.size()) break;
            size_t j = i;
            if (max == 0) {  // the rest, as it is
              out.push_back(s.substr(i));
              break;
            }
            while (j < s.size() && SpaceAt(s, j) == 0) ++j;
            out.push_back(s.substr(i, j - i));
            if (max > 0) --max;
            i = j;
          }
          return Of(std::move(out));
        }
        if (sep->empty()) Fail("split: empty separator");
        size_t i = 0;
        for (;;) {
          const size_t j = max == 0 ? std::string::npos : s.find(*sep, i);
          if (j == std::string::npos) {
            out.push_back(s.substr(i));
            return Of(std::move(out));
          }
          out.push_back(s.substr(i, j - i));
          if (max > 0) --max;
          i = j + sep->size();
        }
      }
      if (name == "replace") {
        const std::string* from = str_arg(0);
        const std::string* to = str_arg(1);
        if (from == nullptr || to == nullptr) Fail("replace: takes two strings");
        return Of(Replace(s, *from, *to,
                          args.size() > 2 && IsInt(args[2].j()) ? args[2].j().get<int64_t>() : -1));
      }
      if (name == "find") {
        const std::string* sub = str_arg(0);
        if (sub == nullptr) Fail("find: takes a string");
        const size_t at = s.find(*sub);
        return Of(at == std::string::npos
                      ? int64_t{-1}
                      : static_cast<int64_t>(CodePoints(s.substr(0, at)).size() - 1));
      }
      if (name == "join") {
        std::string out;
        const std::vector<json> items = args.empty() ? std::vector<json>() : Items(args[0]);
        for (size_t k = 0; k < items.size(); ++k) {
          out += (k ? s : "") + Str(Of(items[k]));
          CheckSize(out.size());
        }
        return Of(out);
      }
    }
    if (!self.undefined && self.j().is_object()) {
      if (name == "items") {
        json out = json::array();
        for (auto it = self.j().begin(); it != self.j().end(); ++it)
          out.push_back({it.key(), it.value()});
        return Of(std::move(out));
      }
      if (name == "keys" || name == "values") {
        json out = json::array();
        for (auto it = self.j().begin(); it != self.j().end(); ++it) {
          out.push_back(name == "keys" ? json(it.key()) : it.value());
        }
        return Of(std::move(out));
      }
      if (name == "get") {
        const Value found = args.empty() ? Undefined() : Item(self, args[0]);
        if (!found.undefined) return found;
        return args.size() > 1 ? args[1] : Of(nullptr);
      }
    }
    Fail(absl::StrCat("unknown method '", name, "' of a ", TypeName(self), " (at ", pos, ")"));
  }

  static std::string Replace(const std::string& s, const std::string& from, const std::string& to,
                             int64_t count) {
    std::string out;
    if (from.empty()) {  // Python: the replacement around every character
      const std::vector<size_t> at = CodePoints(s);
      for (size_t k = 0; k + 1 < at.size(); ++k) {
        if (count != 0) {
          out += to;
          --count;
        }
        out += s.substr(at[k], at[k + 1] - at[k]);
        CheckSize(out.size());
      }
      return count != 0 ? out + to : out;
    }
    size_t i = 0;
    for (size_t j; count != 0 && (j = s.find(from, i)) != std::string::npos; --count) {
      out += s.substr(i, j - i) + to;
      CheckSize(out.size());
      i = j + from.size();
    }
    return out + s.substr(i);
  }

  Value Filter(const Expr& e) {
    const Value v = Eval(*e.args[0]);
    std::vector<Value> args = Args(e, 1);
    std::map<std::string, Value> kwargs = Kwargs(e);
    return ApplyFilter(e.name, v, args, kwargs, e.pos);
  }

  Value ApplyFilter(const std::string& f, const Value& v, const std::vector<Value>& args,
                    const std::map<std::string, Value>& kwargs, size_t pos) {
    auto arg = [&](size_t k, const char* key) -> const Value* {
      if (k < args.size()) return &args[k];
      auto it = kwargs.find(key);
      return it != kwargs.end() ? &it->second : nullptr;
    };
    auto need_string = [&]() -> const std::string& {
      if (v.undefined || !v.j().is_string()) {
        Fail(
            absl::StrCat("filter ", f, ": takes a string, got a ", TypeName(v), " (at ", pos, ")"));
      }
      return v.j().get_ref<const std::string&>();
    };
    if (f == "safe") return v;
    if (f == "trim") {
      const Value* chars = arg(0, "chars");
      const std::string* c = chars != nullptr && chars->j().is_string()
                                 ? &chars->j().get_ref<const std::string&>()
                                 : nullptr;
      return Of(StripChars(need_string(), c, true, true));
    }
    if (f == "upper" || f == "lower") return Of(Case(need_string(), f == "upper"));
    if (f == "title") {  // jinja2's do_title, unlike str.title: words begin after -\s({[<
      std::string out = need_string();
      bool start = true;
      for (char& c : out) {
        const bool boundary =
            c == '-' || IsSpace(c) || c == '(' || c == '{' || c == '[' || c == '<';
        if (boundary) {
          start = true;
          continue;
        }
        c = static_cast<char>(start ? std::toupper(static_cast<unsigned char>(c))
                                    : std::tolower(static_cast<unsigned char>(c)));
        start = false;
      }
      return Of(out);
    }
    if (f == "capitalize") return Of(Title(need_string(), true));
    if (f == "replace") {
      const Value* from = arg(0, "old");
      const Value* to = arg(1, "new");
      if (from == nullptr || to == nullptr || !from->j().is_string() || !to->j().is_string()) {
        Fail("filter replace: takes two strings");
      }
      return Of(
          Replace(need_string(), from->j().get<std::string>(), to->j().get<std::string>(), -1));
    }
    if (f == "length" || f == "count") {
      if (v.undefined) return Of(int64_t{0});
      if (v.lazy) Fail(absl::StrCat("filter ", f, ": a generator has no length (add |list)"));
      if (v.j().is_string())
        return Of(static_cast<int64_t>(CodePoints(v.j().get<std::string>()).size() - 1));
      if (v.j().is_array() || v.j().is_object()) return Of(static_cast<int64_t>(v.j().size()));
      Fail(absl::StrCat("filter length: a ", TypeName(v), " has none (at ", pos, ")"));
    }
    if (f == "string") return Of(Str(v));
    if (f == "int" || f == "float") {  // jinja2: the conversion, else 0 (no partial parses)
      if (v.undefined) return f == "int" ? Of(int64_t{0}) : Of(0.0);
      const json& j = v.j();
      if (f == "int" && (IsInt(j) || j.is_boolean())) return Of(AsInt(j));
      double d = 0;
      bool ok = Numeric(j);
      if (ok) d = AsDouble(j);
      if (j.is_string()) {
        std::string text = StripChars(j.get<std::string>(), nullptr, true, true);
        text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
        char* end = nullptr;
        ok = false;
        if (!text.empty()) {
          if (f == "int") {  // int(text), then int(float(text))
            errno = 0;
            const long long n = std::strtoll(text.c_str(), &end, 10);
            if (*end == '\0' && errno == 0) return Of(static_cast<int64_t>(n));
          }
          d = std::strtod(text.c_str(), &end);  // Python's float(): no hexadecimal
          ok = *end == '\0' && text.find_first_of("xXpP") == std::string::npos;
        }
      }
      if (f == "float") return Of(ok ? d : 0.0);
      if (!ok || !std::isfinite(d) || std::fabs(d) >= 9.2e18) return Of(int64_t{0});
      return Of(static_cast<int64_t>(d));
    }
    if (f == "abs") {
      if (!v.undefined && IsInt(v.j())) {
        const int64_t n = AsInt(v.j());
        if (n == INT64_MIN) Fail("filter abs: integer overflow");
        return Of(n < 0 ? -n : n);
      }
      if (!v.undefined && v.j().is_number()) return Of(std::fabs(v.j().get<double>()));
      Fail("filter abs: takes a number");
    }
    if (f ==
        "tojson") {  // transformers' json.dumps(x, ensure_ascii, indent, separators, sort_keys)
      const Value* ascii = arg(0, "ensure_ascii");
      const Value* indent = arg(1, "indent");
      const Value* separators = arg(2, "separators");
      const Value* sort = arg(3, "sort_keys");
      DumpStyle style;
      style.ascii = ascii != nullptr && Truthy(*ascii);
      style.sort = sort != nullptr && Truthy(*sort);
      if (indent != nullptr && IsInt(indent->j())) {
        style.indent =
            std::string(static_cast<size_t>(std::clamp<int64_t>(AsInt(indent->j()), 0, 64)), ' ');
        style.pretty = true;
      } else if (indent != nullptr && indent->j().is_string()) {
        style.indent = indent->j().get<std::string>();
        style.pretty = true;
      }
      style.item = style.pretty ? "," : ", ";
      if (separators != nullptr && separators->j().is_array() && separators->j().size() == 2 &&
          separators->j()[0].is_string() && separators->j()[1].is_string()) {
        style.item = separators->j()[0].get<std::string>();
        style.key = separators->j()[1].get<std::string>();
      }
      std::string out;
      Dumps(v.undefined ? json(nullptr) : v.j(), style, 0, &out);
      return Of(out);
    }
    if (f == "default" || f == "d") {
      const Value* dflt = arg(0, "default_value");
      const Value* boolean = arg(1, "boolean");
      const bool use = v.undefined || (boolean != nullptr && Truthy(*boolean) && !Truthy(v));
      return use ? (dflt != nullptr ? *dflt : Of(std::string())) : v;
    }
    if (f == "first" || f == "last") {
      const std::vector<json> items = Items(v);
      if (items.empty()) return Undefined();
      return Of(f == "first" ? items.front() : items.back());
    }
    if (f == "last" && v.lazy) Fail("filter last: a generator cannot be reversed (add |list)");
    if (f == "list") {
      json out = json::array();
      for (json& item : Items(v)) out.push_back(std::move(item));
      return Of(std::move(out));
    }
    if (f == "reverse") {
      std::vector<json> items = Items(v);
      std::reverse(items.begin(), items.end());
      if (!v.undefined && v.j().is_string()) {
        std::string s;
        for (const json& c : items) s += c.get<std::string>();
        return Of(s);
      }
      return Lazy(Of(json(items)));
    }
    if (f == "items") return Method(v, "items", {}, pos);
    if (f == "join") {
      const Value* sep = arg(0, "d");
      const Value* attribute = arg(1, "attribute");
      std::string out;
      bool first = true;
      for (const json& item : Items(v)) {
        const Value x = attribute != nullptr ? Item(Of(item), *attribute) : Of(item);
        out += (first ? "" : (sep != nullptr ? Str(*sep) : "")) + Str(x);
        CheckSize(out.size());
        first = false;
      }
      return Of(out);
    }
    if (f == "map") {
      json out = json::array();
      const Value* attribute = kwargs.count("attribute") ? &kwargs.at("attribute") : nullptr;
      for (const json& item : Items(v)) {
        if (attribute != nullptr) {
          out.push_back(Item(Of(item), *attribute).j());
        } else if (!args.empty() && args[0].j().is_string() &&
                   Filters().count(args[0].j().get<std::string>()) &&
                   args[0].j().get<std::string>() != "map") {
          out.push_back(ApplyFilter(args[0].j().get<std::string>(), Of(item),
                                    std::vector<Value>(args.begin() + 1, args.end()), {}, pos)
                            .j());
        } else {
          Fail("filter map: takes attribute= or a filter name");
        }
      }
      return Lazy(Of(std::move(out)));
    }
    if (f == "selectattr" || f == "rejectattr") {
      if (args.empty() || !args[0].j().is_string())
        Fail(absl::StrCat("filter ", f, ": takes an attribute name"));
      json out = json::array();
      for (const json& item : Items(v)) {
        const Value attr = Item(Of(item), args[0]);
        bool hit;
        if (args.size() > 1 && args[1].j().is_string()) {
          const std::string test = args[1].j().get<std::string>();
          if (Tests().count(test) == 0) Fail(absl::StrCat("unsupported test '", test, "'"));
          hit = Test(test, attr, args.size() > 2 ? args[2] : Undefined());
        } else {
          hit = Truthy(attr);
        }
        if (hit == (f == "selectattr")) out.push_back(item);
      }
      return Lazy(Of(std::move(out)));
    }
    if (f == "select" || f == "reject") {
      json out = json::array();
      for (const json& item : Items(v)) {
        bool hit;
        if (!args.empty() && args[0].j().is_string()) {
          const std::string test = args[0].j().get<std::string>();
          if (Tests().count(test) == 0) Fail(absl::StrCat("unsupported test '", test, "'"));
          hit = Test(test, Of(item), args.size() > 1 ? args[1] : Undefined());
        } else {
          hit = Truthy(Of(item));
        }
        if (hit == (f == "select")) out.push_back(item);
      }
      return Lazy(Of(std::move(out)));
    }
    Fail(absl::StrCat("unsupported filter '", f, "' (at ", pos, ")"));
  }

  static bool Equal(const Value& a, const Value& b) {
    if (a.undefined || b.undefined) return a.undefined && b.undefined;
    if (Numeric(a.j()) && Numeric(b.j()) && (a.j().is_boolean() || b.j().is_boolean())) {
      return AsDouble(a.j()) == AsDouble(b.j());  // True == 1
    }
    if (a.j().is_number() && b.j().is_number()) {
      if (IsInt(a.j()) && IsInt(b.j())) return a.j().get<int64_t>() == b.j().get<int64_t>();
      return a.j().get<double>() == b.j().get<double>();
    }
    return a.j() == b.j();
  }

  static bool Test(const std::string& t, const Value& v, const Value& arg) {
    const json& j = v.j();
    const bool def = !v.undefined;
    if (t == "defined") return def;
    if (t == "undefined") return !def;
    if (t == "none") return def && j.is_null();
    if (t == "string") return def && j.is_string();
    if (t == "number") return def && Numeric(j);  // bool is a number in Python
    if (t == "integer") return def && IsInt(j);
    if (t == "float") return def && j.is_number_float();
    if (t == "boolean") return def && j.is_boolean();
    if (t == "true") return def && j.is_boolean() && j.get<bool>();
    if (t == "false") return def && j.is_boolean() && !j.get<bool>();
    if (t == "mapping") return def && j.is_object();
    if (t == "iterable") return def && (j.is_array() || j.is_object() || j.is_string());
    if (t == "sequence") return def && (j.is_array() || j.is_object() || j.is_string());
    if (t == "lower" || t == "upper") {  // Python: some cased letter, none of the other case
      if (!def || !j.is_string()) return false;
      const std::string& str = j.get_ref<const std::string&>();
      const bool cased = Case(str, true) != Case(str, false);
      return cased && Case(str, t == "upper") == str;
    }
    if (t == "even" || t == "odd" || t == "divisibleby") {
      if (!def || !IsInt(j)) Fail(absl::StrCat("test ", t, ": takes an integer"));
      const int64_t n = j.get<int64_t>();
      if (t == "divisibleby") {
        if (arg.undefined || !IsInt(arg.j()) || arg.j().get<int64_t>() == 0)
          Fail("test divisibleby: takes a non-zero integer");
        return n % arg.j().get<int64_t>() == 0;
      }
      return (n % 2 == 0) == (t == "even");
    }
    if (t == "eq" || t == "equalto" || t == "==" || t == "sameas") return Equal(v, arg);
    if (t == "ne" || t == "!=") return !Equal(v, arg);
    if (t == "in") return Contains(arg, v);
    if (t == "lt" || t == "<") return Less(v, arg, false);
    if (t == "le" || t == "<=") return Less(v, arg, true);
    if (t == "gt" || t == ">") return Less(arg, v, false);
    return Less(arg, v, true);  // ge, >=
  }

  static bool Less(const Value& a, const Value& b, bool or_equal) {
    if (!a.undefined && !b.undefined) {
      if (a.j().is_number() && b.j().is_number()) {
        if (IsInt(a.j()) && IsInt(b.j())) {
          return or_equal ? a.j().get<int64_t>() <= b.j().get<int64_t>()
                          : a.j().get<int64_t>() < b.j().get<int64_t>();
        }
        return or_equal ? a.j().get<double>() <= b.j().get<double>()
                        : a.j().get<double>() < b.j().get<double>();
      }
      if (a.j().is_string() && b.j().is_string()) {
        return or_equal ? a.j().get<std::string>() <= b.j().get<std::string>()
                        : a.j().get<std::string>() < b.j().get<std::string>();
      }
    }
    Fail(absl::StrCat("cannot order a ", TypeName(a), " and a ", TypeName(b)));
  }

  static bool Contains(const Value& container, const Value& item) {
    if (container.undefined) return false;
    const json& c = container.j();
    if (c.is_string()) {
      if (item.undefined || !item.j().is_string()) Fail("'in <string>' takes a string on the left");
      return c.get_ref<const std::string&>().find(item.j().get_ref<const std::string&>()) !=
             std::string::npos;
    }
    if (c.is_array()) {
      for (const json& x : c) {
        if (Equal(Of(x), item)) return true;
      }
      return false;
    }
    if (c.is_object())
      return !item.undefined && item.j().is_string() && c.contains(item.j().get<std::string>());
    Fail(absl::StrCat("'in' needs a string, list or dict, not a ", TypeName(container)));
  }

  static Value BinaryOp(const std::string& op, const Value& a, const Value& b, size_t pos) {
    if (op == "==") return Of(Equal(a, b));
    if (op == "!=") return Of(!Equal(a, b));
    if (op == "<") return Of(Less(a, b, false));
    if (op == "<=") return Of(Less(a, b, true));
    if (op == ">") return Of(Less(b, a, false));
    if (op == ">=") return Of(Less(b, a, true));
    if (op == "in") return Of(Contains(b, a));
    if (op == "not in") return Of(!Contains(b, a));
    if (op == "~") {
      std::string x = Str(a), y = Str(b);
      CheckSize(x.size() + y.size());
      return Of(x + y);
    }
    const bool defined = !a.undefined && !b.undefined;
    auto overflow = [&]() -> Value {
      Fail(absl::StrCat("integer overflow in '", op, "' (at ", pos, ")"));
    };
    if (defined && Numeric(a.j()) && Numeric(b.j())) {
      const bool ints = !a.j().is_number_float() && !b.j().is_number_float();
      const double x = AsDouble(a.j()), y = AsDouble(b.j());
      if (ints && op != "/") {
        const int64_t m = AsInt(a.j()), n = AsInt(b.j());
        int64_t r = 0;
        if (op == "+") return __builtin_add_overflow(m, n, &r) ? overflow() : Of(r);
        if (op == "-") return __builtin_sub_overflow(m, n, &r) ? overflow() : Of(r);
        if (op == "*") return __builtin_mul_overflow(m, n, &r) ? overflow() : Of(r);
        if (op == "**") {
          if (n < 0) return Of(std::pow(x, y));
          int64_t p = 1;
          for (int64_t k = 0; k < n; ++k) {
            if (__builtin_mul_overflow(p, m, &p)) return overflow();
            if (p == 0 || p == 1) break;  // 0 and 1 stay; -1 alternates
            if (p == -1) {
              p = (n - k - 1) % 2 == 0 ? -1 : 1;
              break;
            }
          }
          return Of(p);
        }
        if (n == 0) Fail(absl::StrCat("division by zero (at ", pos, ")"));
        if (m == INT64_MIN && n == -1) return op == "%" ? Of(int64_t{0}) : overflow();
        int64_t q = m / n;
        r = m % n;  // Python floors
        if (r != 0 && ((r < 0) != (n < 0))) {
          --q;
          r += n;
        }
        return Of(op == "//" ? q : r);
      }
      if (op == "+") return Of(x + y);
      if (op == "-") return Of(x - y);
      if (op == "*") return Of(x * y);
      if (op == "**") return Of(std::pow(x, y));
      if (y == 0) Fail(absl::StrCat("division by zero (at ", pos, ")"));
      if (op == "/") return Of(x / y);
      if (op == "//") return Of(std::floor(x / y));
      return Of(x - std::floor(x / y) * y);
    }
    if (defined && op == "+" && a.j().is_string() && b.j().is_string()) {
      CheckSize(a.j().get_ref<const std::string&>().size() +
                b.j().get_ref<const std::string&>().size());
      return Of(a.j().get<std::string>() + b.j().get<std::string>());
    }
    if (defined && op == "+" && a.j().is_array() && b.j().is_array()) {
      CheckSize((a.j().size() + b.j().size()) * 16);
      json out = a.j();
      for (const json& x : b.j()) out.push_back(x);
      return Of(std::move(out));
    }
    if (defined && op == "*" && (IsInt(a.j()) || IsInt(b.j()))) {  // repetition, either way
      const Value& seq = IsInt(a.j()) ? b : a;
      const int64_t times = std::max<int64_t>(0, AsInt(IsInt(a.j()) ? a.j() : b.j()));
      if (seq.j().is_string()) {
        const std::string& unit = seq.j().get_ref<const std::string&>();
        if (!unit.empty()) CheckSize(unit.size() * std::min<int64_t>(times, kMaxValue + 1));
        std::string out;
        for (int64_t k = 0; k < times && !unit.empty(); ++k) out += unit;
        return Of(out);
      }
      if (seq.j().is_array()) {
        if (!seq.j().empty())
          CheckSize(seq.j().size() * 16 * std::min<int64_t>(times, kMaxValue + 1));
        json out = json::array();
        for (int64_t k = 0; k < times && !seq.j().empty(); ++k) {
          for (const json& x : seq.j()) out.push_back(x);
        }
        return Of(std::move(out));
      }
    }
    Fail(absl::StrCat("cannot apply '", op, "' to a ", TypeName(a), " and a ", TypeName(b), " (at ",
                      pos, ")"));
  }

  static constexpr int64_t kMaxSteps = 1'000'000;
  static constexpr size_t kMaxBytes = size_t{256} << 20;
  size_t made_ = 0;
  static constexpr size_t kMaxOutput = size_t{16} << 20;

  std::vector<std::map<std::string, Value>> scopes_;  // innermost last
  int64_t steps_ = 0;
};

}  // namespace

struct Program {
  std::vector<Node> body;
};

absl::StatusOr<Template> Template::Parse(std::string_view source) {
  try {
    auto program = std::make_shared<Program>();
    // jinja2 reads "\r\n" and "\r" as "\n" and drops one newline at the very end.
    std::string text;
    text.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        text += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        text += source[i];
      }
    }
    if (!text.empty() && text.back() == '\n') text.pop_back();
    program->body = Parser(Lexer(text).Run()).Template();
    Template t;
    t.program_ = std::move(program);
    return t;
  } catch (const Error& e) {
    return absl::InvalidArgumentError(absl::StrCat("chat template: ", e.message));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("chat template: ", e.what()));
  }
}

absl::StatusOr<std::string> Template::Render(const json& variables) const {
  try {
    std::string out;
    Renderer(variables).Exec(program_->body, &out);
    return out;
  } catch (const Error& e) {
    return absl::InvalidArgumentError(e.message);
  } catch (const std::exception& e) {  // json type errors; allocation failures
    return absl::InvalidArgumentError(absl::StrCat("chat template: ", e.what()));
  }
}

}  // namespace tinyserve::jinja
