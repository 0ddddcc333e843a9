// File: worker/sampling/regex.cc
// Pattern -> syntax tree -> Thompson NFA over character classes -> DFA (subset construction)
// -> live states only, with the length bounds folded in as a product automaton.
#include "worker/sampling/regex.h"

#include <algorithm>
#include <cctype>
#include <deque>
#include <map>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tinyserve {
namespace {

constexpr char32_t kMaxCp = 0x10FFFF;
constexpr char32_t kSurrogateLo = 0xD800, kSurrogateHi = 0xDFFF;
constexpr int kMaxNfaStates = 200000;
constexpr size_t kMaxTable = size_t{1} << 22;  // DFA transitions (16 MB)
// Determinization steps; the NFA sets kept (keys of the state and move maps) are a part of
// them, so this bounds memory as well (to some 100 MB) and time (well under a second).
constexpr size_t kMaxWork = size_t{1} << 24;

using Ranges = std::vector<std::pair<char32_t, char32_t>>;  // inclusive, sorted, disjoint

// Sorted, merged, without surrogates (no decoded text holds one).
Ranges Normalize(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (auto [lo, hi] : r) {
    if (!out.empty() && lo <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, hi);
    } else {
      out.push_back({lo, hi});
    }
  }
  Ranges cut;
  for (auto [lo, hi] : out) {
    if (hi < kSurrogateLo || lo > kSurrogateHi) {
      cut.push_back({lo, hi});
      continue;
    }
    if (lo < kSurrogateLo) cut.push_back({lo, kSurrogateLo - 1});
    if (hi > kSurrogateHi) cut.push_back({kSurrogateHi + 1, hi});
  }
  return cut;
}

Ranges Complement(const Ranges& r) {
  Ranges out;
  char32_t next = 0;
  for (auto [lo, hi] : r) {
    if (lo > next) out.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= kMaxCp) out.push_back({next, kMaxCp});
  return Normalize(out);
}

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const Ranges kSpace = {{'\t', '\r'}, {' ', ' '}};
// ECMA-262's WhiteSpace and LineTerminator (JSON Schema's \s), and its LineTerminator ("."
// matches none of them).
const Ranges kEcmaSpace = {{'\t', '\r'},     {' ', ' '},       {0xA0, 0xA0},     {0x1680, 0x1680},
                           {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F},
                           {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
const Ranges kLineTerminators = {{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}};

struct Node {
  enum Kind : uint8_t { kSet, kConcat, kAlt, kRepeat };
  Kind kind = kConcat;  // an empty kConcat matches the empty text
  int set = -1;
  std::vector<int> kids;
  int min = 0, max = 0;  // kRepeat; max -1: unbounded
};

class Parser {
 public:
  explicit Parser(std::string_view p) : p_(p) {}

  // The root node, or -1 with error() set.
  // search: JSON Schema's reading (ECMA-262): the text contains a match, "." and \s are
  // ECMA's, {,m} is literal. A top-level branch may start with "^" and end with "$", which
  // anchor that branch (in search mode; in whole-match mode they change nothing).
  int Parse(bool search) {
    ecma_ = search;
    Node alt;
    alt.kind = Node::kAlt;
    int any = -1;
    while (true) {
      const bool anchored_start = !AtEnd() && Peek() == '^';
      if (anchored_start) ++i_;
      const int branch = Concat();
      if (branch < 0) return -1;
      const bool anchored_end = AtEnd() ? false : Peek() == '$';
      if (anchored_end) ++i_;
      if (!search) {
        alt.kids.push_back(branch);
      } else {
        if (any < 0) {
          const int any_set = AddSet({{0, kMaxCp}});
          if (any_set < 0) return -1;
          any = Repeat(any_set, 0, -1);
        }
        Node cat;
        if (!anchored_start) cat.kids.push_back(any);
        cat.kids.push_back(branch);
        if (!anchored_end) cat.kids.push_back(any);
        alt.kids.push_back(Add(std::move(cat)));
      }
      if (AtEnd() || Peek() != '|') break;
      ++i_;
    }
    if (!AtEnd()) {
      return Fail(Peek() == ')' ? "unbalanced parenthesis"
                                : "anchors are supported only at a branch's start and end");
    }
    return alt.kids.size() == 1 ? alt.kids[0] : Add(std::move(alt));
  }
  const std::string& error() const { return error_; }
  std::vector<Node> nodes;
  std::vector<Ranges> sets;

 private:
  int Fail(const std::string& what) {
    if (error_.empty()) error_ = absl::StrCat("at offset ", i_, ": ", what);
    return -1;
  }
  int Add(Node n) {
    nodes.push_back(std::move(n));
    return static_cast<int>(nodes.size()) - 1;
  }
  int AddSet(const Ranges& r) {  // equal sets share an index (each literal is a set)
    auto [it, fresh] = set_index_.emplace(Normalize(r), static_cast<int>(sets.size()));
    if (fresh) {
      if (sets.size() >= kMaxSets) return Fail("uses too many distinct characters and classes");
      sets.push_back(it->first);
    }
    Node n;
    n.kind = Node::kSet;
    n.set = it->second;
    return Add(std::move(n));
  }
  int Repeat(int kid, int min, int max) {
    Node n;
    n.kind = Node::kRepeat;
    n.kids = {kid};
    n.min = min;
    n.max = max;
    return Add(std::move(n));
  }
  bool AtEnd() const { return i_ >= p_.size(); }
  // A top-level "$" that ends its branch (the caller takes it as the anchor).
  bool BranchEnd() const {
    return depth_ == 0 && Peek() == '$' && (i_ + 1 == p_.size() || p_[i_ + 1] == '|');
  }
  char Peek() const { return p_[i_]; }

  // One UTF-8 code point of the pattern.
  bool TakeCp(char32_t* cp) {
    const unsigned char c = p_[i_];
    const int n = c < 0x80 ? 1 : c < 0xC2 ? 0 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : c < 0xF5 ? 4 : 0;
    if (n == 0 || i_ + n > p_.size()) return Fail("invalid UTF-8") >= 0;
    char32_t v = n == 1 ? c : c & (0x7F >> n);
    for (int k = 1; k < n; ++k) {
      const unsigned char d = p_[i_ + k];
      if ((d & 0xC0) != 0x80) return Fail("invalid UTF-8") >= 0;
      v = v << 6 | (d & 0x3F);
    }
    static constexpr char32_t kLeast[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < kLeast[n] || v > kMaxCp || (v >= kSurrogateLo && v <= kSurrogateHi)) {
      return Fail("invalid UTF-8") >= 0;
    }
    i_ += n;
    *cp = v;
    return true;
  }

  int Alt() {
    Node alt;
    alt.kind = Node::kAlt;
    while (true) {
      const int c = Concat();
      if (c < 0) return -1;
      alt.kids.push_back(c);
      if (AtEnd() || Peek() != '|') break;
      ++i_;
    }
    return alt.kids.size() == 1 ? alt.kids[0] : Add(std::move(alt));
  }

  int Concat() {
    Node cat;
    while (!AtEnd() && Peek() != '|' && Peek() != ')' && !BranchEnd()) {
      const int r = Repeated();
      if (r < 0) return -1;
      cat.kids.push_back(r);
    }
    return cat.kids.size() == 1 ? cat.kids[0] : Add(std::move(cat));
  }

  // {n}, {n,}, {n,m}, {,m} at i_; false (i_ unchanged) when the brace is not one.
  bool Braces(int* min, int* max) {
    size_t j = i_ + 1;
    auto number = [&](int* out) {
      const size_t from = j;
      long v = 0;
      while (j < p_.size() && p_[j] >= '0' && p_[j] <= '9') {
        v = std::min<long>(v * 10 + (p_[j] - '0'), 1L << 30);
        ++j;
      }
      *out = static_cast<int>(v);
      return j > from;
    };
    int lo = 0, hi = 0;
    const bool has_lo = number(&lo);
    if (!has_lo && ecma_) return false;  // ECMA: "{,m}" is text
    if (j < p_.size() && p_[j] == '}') {
      if (!has_lo) return false;
      hi = lo;
    } else if (j < p_.size() && p_[j] == ',') {
      ++j;
      if (!number(&hi)) hi = -1;
      if (j >= p_.size() || p_[j] != '}') return false;
    } else {
      return false;
    }
    i_ = j + 1;
    *min = lo;
    *max = hi;
    return true;
  }

  bool IsQuantifier() {
    if (AtEnd()) return false;
    if (Peek() == '*' || Peek() == '+' || Peek() == '?') return true;
    int a, b;
    const size_t at = i_;
    if (Peek() == '{' && Braces(&a, &b)) {
      i_ = at;
      return true;
    }
    return false;
  }

  int Repeated() {
    if (IsQuantifier()) return Fail("nothing to repeat");
    int atom = Atom();
    if (atom < 0 || !IsQuantifier()) return atom;
    int min = 0, max = -1;
    const char q = Peek();
    if (q == '{') {
      Braces(&min, &max);
      if (max >= 0 && min > max) return Fail("min repeat greater than max repeat");
      if (min > Regex::kMaxRepeat || max > Regex::kMaxRepeat) {
        return Fail(absl::StrCat("repeat counts above ", Regex::kMaxRepeat, " are not supported"));
      }
    } else {
      ++i_;
      min = q == '+' ? 1 : 0;
      max = q == '?' ? 1 : -1;
    }
    if (!AtEnd() && Peek() == '?') ++i_;  // lazy: the same language
    if (IsQuantifier()) return Fail("multiple repeat (possessive quantifiers are not supported)");
    return Repeat(atom, min, max);
  }

  int Atom() {
    const char c = Peek();
    if (c == '(') {
      if (++depth_ > kMaxGroupDepth) return Fail("groups nested too deeply");
      ++i_;
      if (!AtEnd() && Peek() == '?') {
        ++i_;
        const char k = AtEnd() ? '\0' : Peek();
        if (k == ':') {
          ++i_;
        } else if (k == 'P' ||
                   (k == '<' && i_ + 1 < p_.size() && p_[i_ + 1] != '=' && p_[i_ + 1] != '!')) {
          if (k == 'P') {
            ++i_;
            if (AtEnd() || Peek() != '<') return Fail("only (?P<name>...) groups are supported");
          }
          const size_t close = p_.find('>', i_);
          if (close == std::string_view::npos || close == i_ + 1) return Fail("bad group name");
          i_ = close + 1;
        } else if (k == '=' || k == '!' || k == '<') {
          return Fail("lookaround is not supported");
        } else {
          return Fail("inline flags and other (?...) groups are not supported");
        }
      }
      const int inner = Alt();
      if (inner < 0) return -1;
      if (AtEnd() || Peek() != ')') return Fail("missing ), unterminated group");
      ++i_;
      --depth_;
      return inner;
    }
    if (c == '[') return Class();
    if (c == '.') {  // any character but a line terminator (Python's: but "\n")
      ++i_;
      return AddSet(ecma_ ? Complement(kLineTerminators) : Complement({{'\n', '\n'}}));
    }
    if (c == '^' || c == '$') {
      return Fail("anchors are supported only at a top-level branch's start and end");
    }
    if (c == '\\') {
      Ranges r;
      if (!Escape(/*in_class=*/false, &r)) return -1;
      return AddSet(r);
    }
    char32_t cp;
    if (!TakeCp(&cp)) return -1;
    return AddSet({{cp, cp}});
  }

  int Hex(int digits, char32_t* out) {
    char32_t v = 0;
    for (int k = 0; k < digits; ++k) {
      if (AtEnd() || !std::isxdigit(static_cast<unsigned char>(Peek()))) {
        return Fail(absl::StrCat("expected ", digits, " hex digits"));
      }
      const char d = Peek();
      v = v * 16 + (d <= '9' ? d - '0' : (d | 0x20) - 'a' + 10);
      ++i_;
    }
    if (v > kMaxCp) return Fail("code point beyond U+10FFFF");
    *out = v;
    return 0;
  }

  // After a backslash: a class (\d...) or one code point, into *r.
  bool Escape(bool in_class, Ranges* r) {
    ++i_;
    if (AtEnd()) return Fail("bad escape (end of pattern)") >= 0;
    const char c = Peek();
    char32_t cp = 0;
    switch (c) {
      case 'd':
        ++i_;
        *r = kDigit;
        return true;
      case 'D':
        ++i_;
        *r = Complement(kDigit);
        return true;
      case 'w':
        ++i_;
        *r = kWord;
        return true;
      case 'W':
        ++i_;
        *r = Complement(kWord);
        return true;
      case 's':
        ++i_;
        *r = ecma_ ? kEcmaSpace : kSpace;
        return true;
      case 'S':
        ++i_;
        *r = Complement(ecma_ ? kEcmaSpace : kSpace);
        return true;
      case 'n':
        cp = '\n';
        break;
      case 't':
        cp = '\t';
        break;
      case 'r':
        cp = '\r';
        break;
      case 'f':
        cp = '\f';
        break;
      case 'v':
        cp = '\v';
        break;
      case 'a':
        cp = 7;
        break;
      case 'x':
      case 'u':
      case 'U':
        ++i_;
        if (Hex(c == 'x' ? 2 : c == 'u' ? 4 : 8, &cp) < 0) return false;
        if (cp >= kSurrogateLo && cp <= kSurrogateHi) {  // \uD83D\uDE00 is one character
          constexpr char kLone[] = "a lone surrogate: write the pair, or the character itself";
          if (cp > 0xDBFF || i_ + 6 > p_.size() || p_[i_] != '\\' || p_[i_ + 1] != 'u') {
            return Fail(kLone) >= 0;
          }
          i_ += 2;
          char32_t low = 0;
          if (Hex(4, &low) < 0) return false;
          if (low < 0xDC00 || low > kSurrogateHi) return Fail(kLone) >= 0;
          cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
        }
        *r = {{cp, cp}};
        return true;
      case '0':
        if (i_ + 1 < p_.size() && p_[i_ + 1] >= '0' && p_[i_ + 1] <= '7') {
          return Fail("octal escapes are not supported") >= 0;
        }
        cp = 0;
        break;
      default:
        if (in_class && c == 'b') {
          cp = '\b';
          break;
        }
        if (c >= '1' && c <= '9') return Fail("backreferences are not supported") >= 0;
        if (c == 'b' || c == 'B' || c == 'A' || c == 'Z' || c == 'z' || c == 'G') {
          return Fail("word boundaries and \\A \\Z anchors are not supported") >= 0;
        }
        if (std::isalnum(static_cast<unsigned char>(c))) {
          return Fail(absl::StrCat("bad escape \\", std::string(1, c))) >= 0;
        }
        if (!TakeCp(&cp)) return false;  // punctuation or a non-ASCII character, as itself
        *r = {{cp, cp}};
        return true;
    }
    ++i_;
    *r = {{cp, cp}};
    return true;
  }

  // One member of a class: an escape (a character or \d...) or a character.
  bool ClassItem(Ranges* r) {
    if (Peek() == '\\') return Escape(/*in_class=*/true, r);
    char32_t cp;
    if (!TakeCp(&cp)) return false;
    *r = {{cp, cp}};
    return true;
  }

  int Class() {
    const size_t open = i_;
    ++i_;
    bool negate = false;
    if (!AtEnd() && Peek() == '^') {
      negate = true;
      ++i_;
    }
    Ranges all;
    bool first = true;
    while (true) {
      if (AtEnd()) {
        i_ = open;
        return Fail("unterminated character set");
      }
      if (Peek() == ']' && !first) break;
      first = false;
      Ranges item;
      if (!ClassItem(&item)) return -1;
      if (i_ + 1 < p_.size() && Peek() == '-' && p_[i_ + 1] != ']') {
        const size_t dash = i_;
        ++i_;
        Ranges hi;
        if (!ClassItem(&hi)) return -1;
        if (item.size() != 1 || hi.size() != 1 || item[0].first != item[0].second ||
            hi[0].first != hi[0].second) {
          i_ = dash;
          return Fail("bad character range");
        }
        if (item[0].first > hi[0].first) {
          i_ = dash;
          return Fail("bad character range (lower bound above upper)");
        }
        item = {{item[0].first, hi[0].first}};
      }
      all.insert(all.end(), item.begin(), item.end());
    }
    ++i_;
    return AddSet(negate ? Complement(Normalize(all)) : all);
  }

  static constexpr int kMaxGroupDepth = 64;
  static constexpr size_t kMaxSets = 4096;

  std::string_view p_;
  size_t i_ = 0;
  int depth_ = 0;
  bool ecma_ = false;
  std::string error_;
  std::map<Ranges, int> set_index_;
};

// A state either consumes one code point of `set` and moves to `out`, or moves on without
// consuming to each of `eps`.
struct NfaState {
  int set = -1;
  int out = -1;
  std::vector<int> eps;
};

}  // namespace

class RegexBuilder {
 public:
  RegexBuilder(const std::vector<Node>& nodes, const std::vector<Ranges>& sets)
      : nodes_(nodes), sets_(sets) {}

  absl::Status Build(int root, const Regex::Options& opt, Regex* re) {
    Classes(re);
    nfa_.push_back({});  // 0: the accepting state
    const int start = Emit(root, 0);
    if (start < 0) return TooComplex();
    std::vector<int32_t> next;
    std::vector<uint8_t> accepting;
    if (absl::Status st = Determinize(start, re->num_classes_, &next, &accepting); !st.ok()) {
      return st;
    }
    const int nc = re->num_classes_;
    if (opt.min_length > 0) {
      // Product with a counter of code points saturating at min_length: (state, count). (The
      // maximum is held at run time against each state's distance to a match, below.)
      const int top = opt.min_length;
      std::map<std::pair<int32_t, int>, int32_t> index;
      std::vector<std::pair<int32_t, int>> states = {{0, 0}};
      index[{0, 0}] = 0;
      std::vector<int32_t> pnext;
      std::vector<uint8_t> pacc;
      for (size_t s = 0; s < states.size(); ++s) {
        const auto [d, k] = states[s];
        pacc.push_back(accepting[d] && k >= opt.min_length);
        for (int c = 0; c < nc; ++c) {
          const int32_t t = next[static_cast<size_t>(d) * nc + c];
          int32_t to = -1;
          if (t >= 0) {
            const std::pair<int32_t, int> key = {t, std::min(k + 1, top)};
            auto [it, fresh] = index.emplace(key, static_cast<int32_t>(states.size()));
            if (fresh) {
              if (states.size() >= Regex::kMaxStates || (states.size() + 1) * nc > kMaxTable) {
                return TooComplex();
              }
              states.push_back(key);
            }
            to = it->second;
          }
          pnext.push_back(to);
        }
      }
      next = std::move(pnext);
      accepting = std::move(pacc);
    }
    if (!KeepLive(nc, &next, &accepting)) {
      return absl::InvalidArgumentError(
          opt.min_length > 0 || opt.max_length < INT_MAX
              ? "matches no text within the length bounds (minLength, maxLength)"
              : "matches no text");
    }
    re->dist_ = Distances(nc, next, accepting);
    re->max_length_ = opt.max_length;
    if (re->dist_[0] > opt.max_length) {
      return absl::InvalidArgumentError(
          "matches no text within the length bounds (minLength, maxLength)");
    }
    re->next_ = std::move(next);
    re->accepting_ = std::move(accepting);
    return absl::OkStatus();
  }

 private:
  static absl::Status TooComplex() {
    return absl::InvalidArgumentError(
        absl::StrCat("is too complex: its automaton would exceed ", Regex::kMaxStates, " states, ",
                     kMaxTable, " transitions or ", kMaxWork, " steps to build"));
  }

  // Code point intervals cut at every set's edges; intervals in the same sets share a class.
  void Classes(Regex* re) {
    std::vector<char32_t> b = {0, kMaxCp + 1};
    for (const Ranges& r : sets_) {
      for (auto [lo, hi] : r) {
        b.push_back(lo);
        b.push_back(hi + 1);
      }
    }
    std::sort(b.begin(), b.end());
    b.erase(std::unique(b.begin(), b.end()), b.end());
    const size_t intervals = b.size() - 1;
    const size_t words = (sets_.size() + 63) / 64;
    std::vector<std::vector<uint64_t>> sig(intervals, std::vector<uint64_t>(words));
    for (size_t s = 0; s < sets_.size(); ++s) {
      for (auto [lo, hi] : sets_[s]) {
        for (size_t i = std::lower_bound(b.begin(), b.end(), lo) - b.begin(); b[i] <= hi; ++i) {
          sig[i][s / 64] |= uint64_t{1} << (s % 64);
        }
      }
    }
    std::map<std::vector<uint64_t>, int> ids;
    re->interval_class_.resize(intervals);
    std::vector<size_t> representative;
    for (size_t i = 0; i < intervals; ++i) {
      auto [it, fresh] = ids.emplace(sig[i], static_cast<int>(ids.size()));
      if (fresh) representative.push_back(i);
      re->interval_class_[i] = it->second;
    }
    re->bounds_ = b;
    re->num_classes_ = static_cast<int>(ids.size());
    set_classes_.assign(sets_.size(), {});
    for (size_t s = 0; s < sets_.size(); ++s) {
      for (size_t c = 0; c < representative.size(); ++c) {
        if ((sig[representative[c]][s / 64] >> (s % 64)) & 1) set_classes_[s].push_back(c);
      }
    }
  }

  int NewState() {
    nfa_.push_back({});
    return static_cast<int>(nfa_.size()) - 1;
  }

  // The NFA of node n followed by state `then`; its entry state, or -1 when too large.
  int Emit(int n, int then) {
    if (nfa_.size() > kMaxNfaStates) return -1;
    const Node& node = nodes_[n];
    switch (node.kind) {
      case Node::kSet: {
        const int s = NewState();
        nfa_[s].set = node.set;
        nfa_[s].out = then;
        return s;
      }
      case Node::kConcat: {
        int at = then;
        for (auto it = node.kids.rbegin(); it != node.kids.rend() && at >= 0; ++it) {
          at = Emit(*it, at);
        }
        return at;
      }
      case Node::kAlt: {
        const int s = NewState();
        for (int kid : node.kids) {
          const int e = Emit(kid, then);
          if (e < 0) return -1;
          nfa_[s].eps.push_back(e);
        }
        return s;
      }
      case Node::kRepeat: {
        const int kid = node.kids[0];
        int at = then;
        if (node.max < 0) {
          const int loop = NewState();
          const int body = Emit(kid, loop);
          if (body < 0) return -1;
          nfa_[loop].eps = {body, then};
          at = loop;
        } else {
          for (int k = node.min; k < node.max; ++k) {  // (x(x)?)? from the inside out
            const int opt = NewState();
            const int body = Emit(kid, at);
            if (body < 0) return -1;
            nfa_[opt].eps = {body, then};
            at = opt;
          }
        }
        for (int k = 0; k < node.min && at >= 0; ++k) at = Emit(kid, at);
        return at;
      }
    }
    return -1;
  }

  // The consuming states reachable without consuming, sorted; -1 first when 0 (accept) is.
  std::vector<int> Closure(std::vector<int> from) {
    std::vector<int> out;
    ++mark_epoch_;
    if (mark_.size() < nfa_.size()) mark_.resize(nfa_.size());
    while (!from.empty()) {
      const int s = from.back();
      from.pop_back();
      if (mark_[s] == mark_epoch_) continue;
      mark_[s] = mark_epoch_;
      ++work_;
      if (s == 0) {
        out.push_back(-1);
      } else if (nfa_[s].set >= 0) {
        out.push_back(s);
      } else {
        from.insert(from.end(), nfa_[s].eps.begin(), nfa_[s].eps.end());
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  struct VectorHash {
    size_t operator()(const std::vector<int>& v) const {
      size_t h = v.size();
      for (int x : v) h = (h ^ static_cast<size_t>(x)) * 0x100000001B3ull;
      return h;
    }
  };

  // Subset construction. Per state, the moves are gathered class by class from each NFA
  // state's own classes (sparse), and each distinct move set's closure is computed once.
  absl::Status Determinize(int start, int nc, std::vector<int32_t>* next,
                           std::vector<uint8_t>* accepting) {
    // Each state's NFA set is kept once, as its key in `index` (node-based: stable).
    std::unordered_map<std::vector<int>, int32_t, VectorHash> index, moved_to;
    std::vector<const std::vector<int>*> states = {
        &index.emplace(Closure({start}), 0).first->first};
    std::vector<std::vector<int>> by_class(nc);
    std::vector<int> touched;
    for (size_t d = 0; d < states.size(); ++d) {
      const std::vector<int>& set = *states[d];
      accepting->push_back(!set.empty() && set[0] == -1);
      for (int s : set) {
        if (s < 0) continue;
        for (int c : set_classes_[nfa_[s].set]) {
          if (by_class[c].empty()) touched.push_back(c);
          by_class[c].push_back(nfa_[s].out);
        }
        work_ += set_classes_[nfa_[s].set].size();
        if (work_ > kMaxWork) return TooComplex();  // checked as it grows: memory too
      }
      const size_t row = next->size();
      next->resize(row + nc, -1);
      for (int c : touched) {
        std::vector<int>& moved = by_class[c];
        std::sort(moved.begin(), moved.end());
        moved.erase(std::unique(moved.begin(), moved.end()), moved.end());
        auto seen = moved_to.find(moved);
        int32_t to;
        if (seen != moved_to.end()) {
          to = seen->second;
        } else {
          std::vector<int> key = Closure(moved);
          work_ += key.size() + moved.size();
          if (work_ > kMaxWork) return TooComplex();
          auto [it, fresh] = index.emplace(std::move(key), static_cast<int32_t>(states.size()));
          if (fresh) {
            if (states.size() >= Regex::kMaxStates || (states.size() + 1) * nc > kMaxTable) {
              return TooComplex();
            }
            states.push_back(&it->first);
          }
          to = it->second;
          moved_to.emplace(moved, to);
        }
        (*next)[row + c] = to;
        moved.clear();
      }
      touched.clear();
      if (work_ > kMaxWork) return TooComplex();
    }
    return absl::OkStatus();
  }

  // Each state's fewest code points to an accepting state (breadth-first, backwards).
  static std::vector<int32_t> Distances(int nc, const std::vector<int32_t>& next,
                                        const std::vector<uint8_t>& accepting) {
    const size_t n = accepting.size();
    std::vector<std::vector<int32_t>> from(n);
    for (size_t s = 0; s < n; ++s) {
      for (int c = 0; c < nc; ++c) {
        const int32_t t = next[s * nc + c];
        if (t >= 0) from[t].push_back(static_cast<int32_t>(s));
      }
    }
    std::vector<int32_t> dist(n, INT32_MAX);
    std::deque<int32_t> queue;
    for (size_t s = 0; s < n; ++s) {
      if (accepting[s]) {
        dist[s] = 0;
        queue.push_back(static_cast<int32_t>(s));
      }
    }
    while (!queue.empty()) {
      const int32_t s = queue.front();
      queue.pop_front();
      for (int32_t p : from[s]) {
        if (dist[p] == INT32_MAX) {
          dist[p] = dist[s] + 1;
          queue.push_back(p);
        }
      }
    }
    return dist;
  }

  // Drops the states from which no accepting state can be reached and renumbers the rest
  // (state 0 stays the start); false when the start is among the dropped.
  static bool KeepLive(int nc, std::vector<int32_t>* next, std::vector<uint8_t>* accepting) {
    const size_t n = accepting->size();
    const std::vector<int32_t> dist = Distances(nc, *next, *accepting);
    std::vector<uint8_t> live(n);
    for (size_t s = 0; s < n; ++s) live[s] = dist[s] != INT32_MAX;
    if (!live[0]) return false;
    std::vector<int32_t> renumber(n, -1);
    int32_t kept = 0;
    for (size_t s = 0; s < n; ++s) {
      if (live[s]) renumber[s] = kept++;
    }
    std::vector<int32_t> out;
    std::vector<uint8_t> acc;
    for (size_t s = 0; s < n; ++s) {
      if (!live[s]) continue;
      acc.push_back((*accepting)[s]);
      for (int c = 0; c < nc; ++c) {
        const int32_t t = (*next)[s * nc + c];
        out.push_back(t >= 0 ? renumber[t] : -1);
      }
    }
    *next = std::move(out);
    *accepting = std::move(acc);
    return true;
  }

  const std::vector<Node>& nodes_;
  const std::vector<Ranges>& sets_;
  std::vector<std::vector<int>> set_classes_;  // set -> the classes in it
  size_t work_ = 0;                            // steps of determinization, bounded
  std::vector<NfaState> nfa_;
  std::vector<uint32_t> mark_;
  uint32_t mark_epoch_ = 0;
};

absl::StatusOr<std::shared_ptr<const Regex>> Regex::Compile(std::string_view pattern,
                                                            const Options& options) {
  if (options.min_length < 0 || options.max_length < options.min_length) {
    return absl::InvalidArgumentError("length bounds are empty (minLength > maxLength)");
  }
  Parser parser(pattern);
  const int root = parser.Parse(options.search);
  if (root < 0) return absl::InvalidArgumentError(parser.error());
  auto re = std::make_shared<Regex>();
  RegexBuilder builder(parser.nodes, parser.sets);
  if (absl::Status st = builder.Build(root, options, re.get()); !st.ok()) return st;
  return std::shared_ptr<const Regex>(std::move(re));
}

std::string Regex::Alternatives(const std::vector<std::string>& texts) {
  std::string out;
  for (size_t i = 0; i < texts.size(); ++i) {
    if (i > 0) out += '|';
    out += "(?:";
    for (unsigned char c : texts[i]) {
      if (c < 0x80 && !std::isalnum(c) && c != ' ' && c != '_') {
        if (c < 0x20 || c == 0x7F) {
          absl::StrAppendFormat(&out, "\\x%02x", c);
          continue;
        }
        out += '\\';
      }
      out += static_cast<char>(c);
    }
    out += ')';
  }
  return out;
}

int Regex::ClassOf(char32_t cp) const {
  const size_t i = std::upper_bound(bounds_.begin(), bounds_.end(), cp) - bounds_.begin() - 1;
  return interval_class_[i];
}

int32_t Regex::Next(int32_t state, char32_t cp) const {
  if (cp > kMaxCp) return -1;
  return next_[static_cast<size_t>(state) * num_classes_ + ClassOf(cp)];
}

bool Regex::AnyNext(int32_t state, char32_t lo, char32_t hi, int64_t budget) const {
  hi = std::min(hi, kMaxCp);
  if (lo > hi || budget < 0) return false;
  const int32_t* row = &next_[static_cast<size_t>(state) * num_classes_];
  for (size_t i = std::upper_bound(bounds_.begin(), bounds_.end(), lo) - bounds_.begin() - 1;
       i + 1 < bounds_.size() && bounds_[i] <= hi; ++i) {
    const int32_t t = row[interval_class_[i]];
    if (t >= 0 && dist_[t] <= budget) return true;
  }
  return false;
}

bool Utf8Matcher::Byte(const Regex& re, unsigned char c) {
  if (state < 0) return false;  // refused before: stays refused
  if (left == 0) {
    if (c < 0x80) return Step(re, c);
    if (c < 0xC2 || c > 0xF4) return false;  // a continuation, an overlong or too large lead
    length = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    left = length - 1;
    value = c & (0x7F >> length);
  } else {
    if ((c & 0xC0) != 0x80) return false;
    value = value << 6 | (c & 0x3F);
    if (--left == 0) return Step(re, value);  // surrogates, overlong forms: excluded below
  }
  // Partway: the code points the bytes so far can still become, for this length.
  static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
  static constexpr uint32_t kMax[5] = {0, 0, 0x7FF, 0xFFFF, 0x10FFFF};
  const uint32_t lo = std::max(value << (6 * left), kMin[length]);
  const uint32_t hi = std::min((value << (6 * left)) | ((1u << (6 * left)) - 1), kMax[length]);
  return re.AnyNext(state, lo, hi, re.Budget(count));  // surrogates lead nowhere
}

bool Utf8Matcher::Step(const Regex& re, char32_t cp) {
  const int32_t t = re.Next(state, cp);
  if (t < 0 || re.Distance(t) > re.Budget(count)) {
    state = -1;
    return false;
  }
  state = t;
  ++count;
  return true;
}

bool JsonStringMatcher::HexViable() const {
  const int span = 4 * (4 - digits_);
  const uint32_t lo = static_cast<uint32_t>(unit_) << span;
  const uint32_t hi = lo | ((1u << span) - 1);
  const int32_t s = m_.state;
  const int64_t budget = re_->Budget(m_.count);
  if (mode_ == Mode::kLowHex) {
    const uint32_t a = std::max<uint32_t>(lo, 0xDC00), b = std::min<uint32_t>(hi, 0xDFFF);
    const uint32_t base = 0x10000 + ((high_ - 0xD800u) << 10);
    return a <= b && re_->AnyNext(s, base + a - 0xDC00, base + b - 0xDC00, budget);
  }
  if (re_->AnyNext(s, lo, hi, budget)) return true;  // surrogates lead nowhere by themselves
  const uint32_t a = std::max<uint32_t>(lo, 0xD800), b = std::min<uint32_t>(hi, 0xDBFF);
  return a <= b && re_->AnyNext(s, 0x10000 + ((a - 0xD800) << 10),
                                0x10000 + ((b - 0xD800) << 10) + 0x3FF, budget);
}

JsonStringMatcher::Step JsonStringMatcher::Byte(unsigned char c) {
  if (m_.state < 0) return Step::kReject;
  const Step step = Take(c);
  if (step == Step::kReject) m_.state = -1;  // refused once, refused after
  return step;
}

JsonStringMatcher::Step JsonStringMatcher::Take(unsigned char c) {
  auto ok = [](bool b) { return b ? Step::kMore : Step::kReject; };
  auto hex = [](unsigned char d) -> int {
    if (d >= '0' && d <= '9') return d - '0';
    if ((d | 0x20) >= 'a' && (d | 0x20) <= 'f') return (d | 0x20) - 'a' + 10;
    return -1;
  };
  switch (mode_) {
    case Mode::kBody:
      if (m_.left == 0) {
        if (c == '"') return re_->Accepting(m_.state) ? Step::kClosed : Step::kReject;
        if (c == '\\') {
          mode_ = Mode::kEscape;
          return ok(re_->AnyNext(m_.state, 0, kMaxCp, re_->Budget(m_.count)));
        }
        if (c < 0x20) return Step::kReject;
      }
      return ok(m_.Byte(*re_, c));
    case Mode::kEscape: {
      char32_t cp;
      switch (c) {
        case '"':
        case '\\':
        case '/':
          cp = c;
          break;
        case 'b':
          cp = '\b';
          break;
        case 'f':
          cp = '\f';
          break;
        case 'n':
          cp = '\n';
          break;
        case 'r':
          cp = '\r';
          break;
        case 't':
          cp = '\t';
          break;
        case 'u':
          mode_ = Mode::kHex;
          digits_ = 0;
          unit_ = 0;
          return Step::kMore;  // '\\' was viable, so some code point is
        default:
          return Step::kReject;
      }
      mode_ = Mode::kBody;
      m_.Step(*re_, cp);
      return ok(m_.state >= 0);
    }
    case Mode::kHex:
    case Mode::kLowHex: {
      const int v = hex(c);
      if (v < 0) return Step::kReject;
      unit_ = static_cast<uint16_t>(unit_ << 4 | v);
      ++digits_;
      if (!HexViable()) return Step::kReject;
      if (digits_ < 4) return Step::kMore;
      if (mode_ == Mode::kLowHex) {
        m_.Step(*re_, 0x10000 + ((high_ - 0xD800u) << 10) + (unit_ - 0xDC00u));
      } else if (unit_ >= 0xD800 && unit_ <= 0xDBFF) {
        high_ = unit_;
        mode_ = Mode::kHighSlash;
        return Step::kMore;
      } else {
        m_.Step(*re_, unit_);
      }
      mode_ = Mode::kBody;
      return ok(m_.state >= 0);
    }
    case Mode::kHighSlash:
      mode_ = Mode::kHighU;
      return ok(c == '\\');
    case Mode::kHighU:
      mode_ = Mode::kLowHex;
      digits_ = 0;
      unit_ = 0;
      return ok(c == 'u');
  }
  return Step::kReject;
}

}  // namespace tinyserve
