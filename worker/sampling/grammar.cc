#include "worker/sampling/grammar.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"

namespace tinyserve {

namespace {

constexpr char32_t kMaxCodePoint = 0x10FFFF;

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

// A sequence of symbols: a character set (index) or a rule reference.
struct Sym {
  bool ref;
  int32_t value;
};
using Alt = std::vector<Sym>;

}  // namespace

// Parses GBNF into rules of alternatives (repetitions written out as llama.cpp does), then
// checks and flattens them into a Grammar.
class GrammarBuilder {
 public:
  explicit GrammarBuilder(std::string_view text) : text_(text) {}

  absl::StatusOr<std::shared_ptr<const Grammar>> Build() {
    if (text_.size() > Grammar::kMaxText) {
      return absl::InvalidArgumentError(
          absl::StrCat("the grammar is ", text_.size(), " bytes; at most ", Grammar::kMaxText));
    }
    if (!Parse()) return absl::InvalidArgumentError(error_);
    for (size_t r = 0; r < rules_.size(); ++r) {
      if (!defined_[r]) {
        return absl::InvalidArgumentError(
            absl::StrCat("rule '", names_[r], "' is used but not defined"));
      }
    }
    auto root = ids_.find("root");
    if (root == ids_.end()) return absl::InvalidArgumentError("the grammar has no rule 'root'");
    if (!DropUnfinishable()) {
      return absl::InvalidArgumentError(
          "the grammar matches no text ('root' cannot finish: every way through it recurses "
          "forever)");
    }
    if (int r = LeftRecursive(); r >= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rule '", names_[owner_[r]],
          "' is left-recursive (it can reach itself before matching a character, for example a "
          "repetition of something that can be empty); llama.cpp refuses this too"));
    }
    return Flatten(root->second);
  }

 private:
  // ---- parsing ----
  bool Fail(size_t at, const std::string& what) {
    if (!error_.empty()) return false;
    int line = 1;
    size_t line_start = 0;
    for (size_t i = 0; i < at && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        line_start = i + 1;
      }
    }
    error_ = absl::StrCat("line ", line, ", column ", at - line_start + 1, ": ", what);
    return false;
  }
  char Peek(size_t k = 0) const { return pos_ + k < text_.size() ? text_[pos_ + k] : '\0'; }
  bool AtEnd() const { return pos_ >= text_.size(); }

  void Space(bool newline_ok) {
    while (!AtEnd()) {
      const char c = Peek();
      if (c == '#') {
        while (!AtEnd() && Peek() != '\n' && Peek() != '\r') ++pos_;
      } else if (c == ' ' || c == '\t' || (newline_ok && (c == '\n' || c == '\r'))) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  int32_t RuleId(std::string_view name) {
    auto [it, added] = ids_.emplace(std::string(name), static_cast<int32_t>(rules_.size()));
    if (added) NewRule(std::string(name), -1);
    return it->second;
  }
  int32_t NewRule(std::string name, int32_t owner) {
    const int32_t id = static_cast<int32_t>(rules_.size());
    rules_.emplace_back();
    names_.push_back(std::move(name));
    defined_.push_back(false);
    owner_.push_back(owner < 0 ? id : owner);
    return id;
  }
  int32_t Generated(int32_t owner, std::vector<Alt> alts) {
    const int32_t id = NewRule(absl::StrCat(names_[owner], "-", rules_.size()), owner);
    rules_[id] = std::move(alts);
    defined_[id] = true;
    return id;
  }
  int32_t SetOf(Grammar::CharSet set) {
    auto [it, added] = set_ids_.emplace(set, static_cast<int32_t>(sets_.size()));
    if (added) sets_.push_back(std::move(set));
    return it->second;
  }
  bool Count(size_t n) {
    elements_ += n;
    if (elements_ > static_cast<size_t>(Grammar::kMaxElements)) {
      return Fail(pos_, absl::StrCat("the grammar needs more than ", Grammar::kMaxElements,
                                     " elements once its repetitions are written out"));
    }
    return true;
  }

  bool Parse() {
    Space(true);
    while (!AtEnd()) {
      if (!ParseRule()) return false;
    }
    return true;
  }

  bool ParseRule() {
    const size_t start = pos_;
    while (IsNameChar(Peek())) ++pos_;
    if (pos_ == start) return Fail(pos_, "expecting a rule name");
    const std::string_view name = text_.substr(start, pos_ - start);
    const int32_t id = RuleId(name);
    if (defined_[id])
      return Fail(start, absl::StrCat("rule '", std::string(name), "' is defined twice"));
    defined_[id] = true;
    Space(false);
    if (text_.substr(pos_, 3) != "::=") return Fail(pos_, "expecting ::=");
    pos_ += 3;
    Space(true);
    std::vector<Alt> alts;
    if (!ParseAlternates(id, false, &alts)) return false;
    rules_[id] = std::move(alts);
    if (Peek() == '\r') {
      ++pos_;
      if (Peek() == '\n') ++pos_;
    } else if (Peek() == '\n') {
      ++pos_;
    } else if (!AtEnd()) {
      return Fail(pos_, "expecting a newline or the end after the rule");
    }
    Space(true);
    return true;
  }

  bool ParseAlternates(int32_t owner, bool nested, std::vector<Alt>* alts) {
    alts->emplace_back();
    if (!ParseSequence(owner, nested, &alts->back())) return false;
    while (Peek() == '|') {
      ++pos_;
      Space(true);
      alts->emplace_back();
      if (!ParseSequence(owner, nested, &alts->back())) return false;
    }
    return true;
  }

  // One character of a literal or class, escapes decoded.
  bool ParseChar(char32_t* cp) {
    if (AtEnd()) return Fail(pos_, "unexpected end of the grammar");
    const size_t at = pos_;
    if (Peek() == '\\') {
      const char e = Peek(1);
      pos_ += 2;
      int hex = 0;
      switch (e) {
        case 'x':
          hex = 2;
          break;
        case 'u':
          hex = 4;
          break;
        case 'U':
          hex = 8;
          break;
        case 't':
          *cp = '\t';
          return true;
        case 'r':
          *cp = '\r';
          return true;
        case 'n':
          *cp = '\n';
          return true;
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-':
          *cp = static_cast<unsigned char>(e);
          return true;
        default:
          return Fail(at, "unknown escape");
      }
      uint32_t v = 0;
      for (int i = 0; i < hex; ++i, ++pos_) {
        const char c = Peek();
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0)
          return Fail(at,
                      absl::StrCat("expecting ", hex, " hex digits after \\", std::string(1, e)));
        v = v << 4 | static_cast<uint32_t>(d);
      }
      if (v > kMaxCodePoint) return Fail(at, "the escape is past U+10FFFF");
      // No UTF-8 text holds one: a grammar naming it could never match.
      if (v >= 0xD800 && v <= 0xDFFF) return Fail(at, "the escape is a surrogate (U+D800..U+DFFF)");
      *cp = v;
      return true;
    }
    // A UTF-8 character of the grammar text.
    const unsigned char c = static_cast<unsigned char>(Peek());
    int n = c < 0x80             ? 0
            : (c & 0xE0) == 0xC0 ? 1
            : (c & 0xF0) == 0xE0 ? 2
            : (c & 0xF8) == 0xF0 ? 3
                                 : -1;
    if (n < 0) return Fail(at, "the grammar is not valid UTF-8");
    uint32_t v = n == 0 ? c : c & (0x3F >> n);
    ++pos_;
    for (int i = 0; i < n; ++i, ++pos_) {
      const unsigned char k = static_cast<unsigned char>(Peek());
      if ((k & 0xC0) != 0x80 || AtEnd()) return Fail(at, "the grammar is not valid UTF-8");
      v = v << 6 | (k & 0x3F);
    }
    *cp = v;
    return true;
  }

  bool Repeat(int32_t owner, Alt* seq, size_t last_start, int64_t min, int64_t max) {
    if (last_start == seq->size()) return Fail(pos_, "a repetition must follow an item");
    const Alt item(seq->begin() + static_cast<ptrdiff_t>(last_start), seq->end());
    seq->resize(last_start);
    for (int64_t i = 0; i < min; ++i) {
      if (!Count(item.size())) return false;
      seq->insert(seq->end(), item.begin(), item.end());
    }
    if (max < 0) {  // R ::= item R |
      const int32_t r = Generated(owner, {});
      Alt again = item;
      again.push_back({true, r});
      if (!Count(again.size())) return false;
      rules_[r] = {again, {}};
      seq->push_back({true, r});
    } else if (max > min) {  // R1 ::= item | ;  Rk ::= item R(k-1) |
      int32_t inner = -1;
      for (int64_t k = 0; k < max - min; ++k) {
        Alt a = item;
        if (inner >= 0) a.push_back({true, inner});
        if (!Count(a.size())) return false;
        inner = Generated(owner, {a, {}});
      }
      seq->push_back({true, inner});
    }
    return true;
  }

  bool ParseInt(int64_t* v) {
    if (!(Peek() >= '0' && Peek() <= '9')) return Fail(pos_, "expecting a number");
    int64_t x = 0;
    while (Peek() >= '0' && Peek() <= '9') {
      x = std::min<int64_t>(x * 10 + (Peek() - '0'), int64_t{1} << 40);  // saturates
      ++pos_;
    }
    *v = x;
    return true;
  }

  bool ParseSequence(int32_t owner, bool nested, Alt* seq) {
    size_t last_start = seq->size();
    while (!AtEnd()) {
      const char c = Peek();
      if (c == '"') {
        ++pos_;
        last_start = seq->size();
        while (Peek() != '"') {
          if (AtEnd()) return Fail(pos_, "the literal has no closing quote");
          char32_t cp;
          if (!ParseChar(&cp) || !Count(1)) return false;
          seq->push_back({false, SetOf({{cp, cp}})});
        }
        ++pos_;
      } else if (c == '[') {
        const size_t at = pos_++;
        bool negate = false;
        if (Peek() == '^') {
          negate = true;
          ++pos_;
        }
        Grammar::CharSet set;
        while (Peek() != ']') {
          if (AtEnd()) return Fail(at, "the character class has no closing ]");
          char32_t lo, hi;
          if (!ParseChar(&lo)) return false;
          hi = lo;
          if (Peek() == '-' && Peek(1) != ']' && Peek(1) != '\0') {
            ++pos_;
            if (!ParseChar(&hi)) return false;
            if (hi < lo) return Fail(at, "a range in the class runs backwards");
          }
          set.push_back({lo, hi});
        }
        ++pos_;
        std::sort(set.begin(), set.end());
        Grammar::CharSet merged;
        for (auto [lo, hi] : set) {
          if (!merged.empty() && lo <= merged.back().second + 1) {
            merged.back().second = std::max(merged.back().second, hi);
          } else {
            merged.push_back({lo, hi});
          }
        }
        if (negate) {
          Grammar::CharSet comp;
          char32_t next = 0;
          for (auto [lo, hi] : merged) {
            if (lo > next) comp.push_back({next, lo - 1});
            next = hi + 1;
          }
          if (next <= kMaxCodePoint) comp.push_back({next, kMaxCodePoint});
          merged = std::move(comp);
        }
        if (merged.empty()) return Fail(at, "the character class matches nothing");
        if (!Count(1)) return false;
        last_start = seq->size();
        seq->push_back({false, SetOf(std::move(merged))});
      } else if (IsNameChar(c)) {
        const size_t start = pos_;
        while (IsNameChar(Peek())) ++pos_;
        if (!Count(1)) return false;
        last_start = seq->size();
        seq->push_back({true, RuleId(text_.substr(start, pos_ - start))});
      } else if (c == '(') {
        const size_t at = pos_++;
        if (++nesting_ > Grammar::kMaxNesting) {
          return Fail(at,
                      absl::StrCat("parentheses nest more than ", Grammar::kMaxNesting, " deep"));
        }
        Space(true);
        std::vector<Alt> alts;
        if (!ParseAlternates(owner, true, &alts)) return false;
        --nesting_;
        if (Peek() != ')') return Fail(at, "the group has no closing )");
        ++pos_;
        if (!Count(1)) return false;
        last_start = seq->size();
        seq->push_back({true, Generated(owner, std::move(alts))});
      } else if (c == '.') {
        ++pos_;
        if (!Count(1)) return false;
        last_start = seq->size();
        seq->push_back({false, SetOf({{0, kMaxCodePoint}})});
      } else if (c == '*' || c == '+' || c == '?') {
        ++pos_;
        // last_start stays: a repetition after a repetition applies to the whole of it, as in
        // llama.cpp ("a"{2}? is ("a" "a")?).
        if (!Repeat(owner, seq, last_start, c == '+' ? 1 : 0, c == '?' ? 1 : -1)) return false;
      } else if (c == '{') {
        const size_t at = pos_++;
        Space(nested);
        int64_t min = 0, max = 0;
        if (!ParseInt(&min)) return false;
        Space(nested);
        if (Peek() == '}') {
          max = min;
        } else if (Peek() == ',') {
          ++pos_;
          Space(nested);
          max = -1;
          if (Peek() >= '0' && Peek() <= '9') {
            if (!ParseInt(&max)) return false;
            Space(nested);
          }
          if (Peek() != '}') return Fail(pos_, "expecting }");
        } else {
          return Fail(pos_, "expecting , or }");
        }
        ++pos_;
        if (min > Grammar::kMaxRepeat) {
          return Fail(at, absl::StrCat("at most ", Grammar::kMaxRepeat, " repetitions, got ", min));
        }
        if (max >= 0 && max < min) return Fail(at, "the repetition's maximum is below its minimum");
        if (max > Grammar::kMaxRepeat) max = -1;  // llama.cpp's reading: no maximum
        if (!Repeat(owner, seq, last_start, min, max)) return false;
      } else if (c == '<' || c == '!') {
        return Fail(pos_, "token references (<[id]>, <text>) are not supported");
      } else {
        break;
      }
      Space(nested);
    }
    return error_.empty();
  }

  // ---- checks ----
  // Drops the alternatives that can never finish; false when root is among the rules left
  // with none.
  bool DropUnfinishable() {
    std::vector<bool> ok(rules_.size(), false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < rules_.size(); ++r) {
        if (ok[r]) continue;
        for (const Alt& a : rules_[r]) {
          if (std::all_of(a.begin(), a.end(),
                          [&](const Sym& s) { return !s.ref || ok[s.value]; })) {
            ok[r] = changed = true;
            break;
          }
        }
      }
    }
    for (size_t r = 0; r < rules_.size(); ++r) {
      auto& alts = rules_[r];
      alts.erase(std::remove_if(alts.begin(), alts.end(),
                                [&](const Alt& a) {
                                  return std::any_of(a.begin(), a.end(), [&](const Sym& s) {
                                    return s.ref && !ok[s.value];
                                  });
                                }),
                 alts.end());
    }
    return ok[ids_.at("root")];
  }

  // A rule on a cycle of "can start with" edges, or -1. As llama.cpp reads it, a reference
  // may be followed to the next one only when its rule has an empty alternative of its own (a
  // cycle through rules that are only empty by way of others ends at run time instead, at a
  // state already expanded).
  int LeftRecursive() const {
    const size_t n = rules_.size();
    std::vector<bool> nullable(n, false);
    for (size_t r = 0; r < n; ++r) {
      for (const Alt& a : rules_[r]) nullable[r] = nullable[r] || a.empty();
    }
    std::vector<std::vector<int32_t>> starts(n);
    for (size_t r = 0; r < n; ++r) {
      for (const Alt& a : rules_[r]) {
        for (const Sym& s : a) {
          if (!s.ref) break;
          starts[r].push_back(s.value);
          if (!nullable[s.value]) break;
        }
      }
    }
    // Iterative DFS with colours: 1 on the path, 2 done.
    std::vector<uint8_t> colour(n, 0);
    for (size_t root = 0; root < n; ++root) {
      if (colour[root] != 0) continue;
      std::vector<std::pair<int32_t, size_t>> path = {{static_cast<int32_t>(root), 0}};
      colour[root] = 1;
      while (!path.empty()) {
        auto& [r, next] = path.back();
        if (next == starts[r].size()) {
          colour[r] = 2;
          path.pop_back();
          continue;
        }
        const int32_t s = starts[r][next++];
        if (colour[s] == 1) return s;
        if (colour[s] == 0) {
          colour[s] = 1;
          path.push_back({s, 0});
        }
      }
    }
    return -1;
  }

  absl::StatusOr<std::shared_ptr<const Grammar>> Flatten(int32_t root) {
    auto g = std::make_shared<Grammar>();
    g->sets_ = std::move(sets_);
    g->elems_ = {{Grammar::Elem::kRef, root}, {Grammar::Elem::kEnd, 0}};
    g->alts_.resize(rules_.size());
    for (size_t r = 0; r < rules_.size(); ++r) {
      for (const Alt& a : rules_[r]) {
        g->alts_[r].push_back(static_cast<int32_t>(g->elems_.size()));
        for (const Sym& s : a) {
          g->elems_.push_back({s.ref ? Grammar::Elem::kRef : Grammar::Elem::kChars, s.value});
        }
        g->elems_.push_back({Grammar::Elem::kEnd, 0});
      }
    }
    Grammar::Scratch scratch;
    scratch.work = {0};
    int64_t budget = Grammar::kMaxExpand;
    g->Expand(&scratch, &g->start_, &budget);
    if (budget < 0 || g->start_.size() > static_cast<size_t>(Grammar::kMaxStacks)) {
      return absl::InvalidArgumentError(
          absl::StrCat("the grammar is too ambiguous or too deep: its start opens more than ",
                       Grammar::kMaxStacks, " parses, takes more than ", Grammar::kMaxExpand,
                       " rule expansions or nests more than ", Grammar::kMaxChain, " rules"));
    }
    return std::shared_ptr<const Grammar>(std::move(g));
  }

  std::string_view text_;
  size_t pos_ = 0;
  std::string error_;
  size_t elements_ = 0;
  int nesting_ = 0;
  std::map<std::string, int32_t, std::less<>> ids_;
  std::vector<std::vector<Alt>> rules_;
  std::vector<std::string> names_;
  std::vector<bool> defined_;
  std::vector<int32_t> owner_;  // the named rule a generated one belongs to
  std::vector<Grammar::CharSet> sets_;
  std::map<Grammar::CharSet, int32_t> set_ids_;
};

absl::StatusOr<std::shared_ptr<const Grammar>> Grammar::Compile(std::string_view text) {
  return GrammarBuilder(text).Build();
}

bool Grammar::Contains(const CharSet& set, char32_t cp) {
  auto it = std::upper_bound(
      set.begin(), set.end(), cp,
      [](char32_t c, const std::pair<char32_t, char32_t>& r) { return c < r.first; });
  return it != set.begin() && cp <= std::prev(it)->second;
}

bool Grammar::Stacks::AddUnique(const std::vector<int32_t>& stack) {
  uint64_t h = 0xcbf29ce484222325ULL ^ stack.size();
  for (int32_t v : stack) h = (h ^ static_cast<uint32_t>(v)) * 0x100000001b3ULL;
  auto equal = [&](size_t i) {
    const uint32_t b = i == 0 ? 0 : end[i - 1];
    return hash[i] == h && end[i] - b == stack.size() &&
           std::equal(stack.begin(), stack.end(), data.begin() + b);
  };
  if (end.size() < kIndexed) {  // few: a scan is cheaper than hashing
    for (size_t i = 0; i < end.size(); ++i) {
      if (equal(i)) return false;
    }
  } else {
    if (end.size() == kIndexed || slots.size() < 2 * end.size()) {
      // Index what is there: the first time past kIndexed since clear(), or to grow.
      size_t n = 64;
      while (n < 4 * end.size()) n <<= 1;
      slots.assign(std::max(n, slots.size()), 0);
      for (size_t i = 0; i < end.size(); ++i) Place(i);
    }
    const size_t mask = slots.size() - 1;
    for (size_t at = h & mask; slots[at] != 0; at = (at + 1) & mask) {
      if (equal(slots[at] - 1)) return false;
    }
  }
  data.insert(data.end(), stack.begin(), stack.end());
  end.push_back(static_cast<uint32_t>(data.size()));
  hash.push_back(h);
  if (end.size() > kIndexed) Place(end.size() - 1);
  return true;
}

void Grammar::Stacks::Place(size_t i) {
  const size_t mask = slots.size() - 1;
  size_t at = hash[i] & mask;
  while (slots[at] != 0) at = (at + 1) & mask;
  slots[at] = static_cast<uint32_t>(i + 1);
}

void Grammar::Expand(Scratch* s, Stacks* to, int64_t* budget, int depth) const {
  if (depth > kMaxChain) *budget = -1;
  if (--*budget < 0 || to->size() > static_cast<size_t>(kMaxStacks)) return;
  std::vector<int32_t>* work = &s->work;
  if (work->empty() || elems_[work->back()].kind == Elem::kChars) {
    to->AddUnique(*work);
    return;
  }
  if (!s->seen.AddUnique(*work)) return;  // expanded already in this step
  const int32_t pos = work->back();
  work->pop_back();
  const bool more = elems_[pos + 1].kind != Elem::kEnd;  // the rule goes on after the reference
  if (more) work->push_back(pos + 1);
  for (int32_t a : alts_[elems_[pos].value]) {
    if (elems_[a].kind == Elem::kEnd) {  // an empty alternative
      Expand(s, to, budget, depth + 1);
    } else {
      work->push_back(a);
      Expand(s, to, budget, depth + 1);
      work->pop_back();
    }
  }
  if (more) work->pop_back();
  work->push_back(pos);
}

void Grammar::Advance(const Stacks& from, char32_t cp, Stacks* to, Scratch* scratch,
                      int64_t* budget) const {
  to->clear();
  scratch->seen.clear();
  std::vector<int32_t>* work = &scratch->work;
  uint32_t begin = 0;
  for (uint32_t end : from.end) {
    if (end != begin) {
      const int32_t top = from.data[end - 1];
      if (Contains(sets_[elems_[top].value], cp)) {
        work->assign(from.data.begin() + begin, from.data.begin() + end - 1);
        if (elems_[top + 1].kind != Elem::kEnd) work->push_back(top + 1);
        Expand(scratch, to, budget);
        if (*budget < 0 || to->size() > static_cast<size_t>(kMaxStacks)) {
          to->clear();
          return;
        }
      }
    }
    begin = end;
  }
}

bool Grammar::AnyIn(const Stacks& stacks, char32_t lo, char32_t hi) const {
  uint32_t begin = 0;
  for (uint32_t end : stacks.end) {
    if (end != begin) {
      const CharSet& set = sets_[elems_[stacks.data[end - 1]].value];
      auto it = std::upper_bound(
          set.begin(), set.end(), hi,
          [](char32_t c, const std::pair<char32_t, char32_t>& r) { return c < r.first; });
      if (it != set.begin() && std::prev(it)->second >= lo) return true;
    }
    begin = end;
  }
  return false;
}

bool Grammar::Finished(const Stacks& stacks) {
  uint32_t begin = 0;
  for (uint32_t end : stacks.end) {
    if (end == begin) return true;
    begin = end;
  }
  return false;
}

void GrammarConstraint::Reset(size_t bytes) const {
  if (levels_.size() < bytes + 1) levels_.resize(bytes + 1);  // before any level points into one
  levels_[0].stacks = &stacks_;
  levels_[0].utf8 = utf8_;
}

bool GrammarConstraint::Step(size_t k, unsigned char c) const {
  static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};  // by length
  const Level& from = levels_[k];
  Level& to = levels_[k + 1];
  Utf8 u = from.utf8;
  if (u.left == 0) {
    if (c < 0x80) {
      u = {c, 0, 1};
    } else if ((c & 0xE0) == 0xC0) {
      u = {c & 0x1Fu, 1, 2};
    } else if ((c & 0xF0) == 0xE0) {
      u = {c & 0x0Fu, 2, 3};
    } else if ((c & 0xF8) == 0xF0 && c <= 0xF4) {
      u = {c & 0x07u, 3, 4};
    } else {
      return false;
    }
  } else {
    if ((c & 0xC0) != 0x80) return false;
    u.value = u.value << 6 | (c & 0x3F);
    --u.left;
  }
  to.utf8 = u;
  to.stacks = from.stacks;
  if (u.left != 0) return true;
  const char32_t cp = u.value;
  if (cp < kMin[u.length] || cp > kMaxCodePoint || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
  int64_t budget = Grammar::kMaxExpand;
  if (scan_left_ > 0) budget = std::min(budget, scan_left_);
  const int64_t given = budget;
  g_->Advance(*from.stacks, cp, &to.own, &scratch_, &budget);
  if (scan_left_ > 0) scan_left_ = std::max<int64_t>(1, scan_left_ - (given - budget));
  to.stacks = &to.own;
  return !to.own.empty();
}

bool GrammarConstraint::CanEnd(size_t k) const {
  static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
  const Utf8& u = levels_[k].utf8;
  if (u.left == 0) return true;
  // The code points this prefix may still become.
  const int shift = 6 * u.left;
  const char32_t lo = std::max<char32_t>(u.value << shift, kMin[u.length]);
  const char32_t hi = std::min<char32_t>((u.value << shift) | ((1u << shift) - 1), kMaxCodePoint);
  return lo <= hi && g_->AnyIn(*levels_[k].stacks, lo, hi);
}

bool GrammarConstraint::Feed(const std::string& bytes) const {
  Reset(bytes.size());
  for (size_t k = 0; k < bytes.size(); ++k) {
    if (!Step(k, static_cast<unsigned char>(bytes[k]))) return false;
  }
  return CanEnd(bytes.size());
}

bool GrammarConstraint::Allows(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= table_->kind.size()) return false;
  if (table_->kind[id] == TokenTable::kEnd) return dead_ || Complete();
  if (dead_ || table_->kind[id] == TokenTable::kSpecial || table_->bytes[id].empty()) return false;
  return Feed(table_->bytes[id]) || (PerParse() && FeedEach(table_->bytes[id], nullptr));
}

const Grammar::Stacks& GrammarConstraint::OneParse(size_t i) const {
  stack_.assign(stacks_.data.begin() + (i == 0 ? 0 : stacks_.end[i - 1]),
                stacks_.data.begin() + stacks_.end[i]);
  one_.clear();
  one_.AddUnique(stack_);
  return one_;
}

bool GrammarConstraint::FeedEach(const std::string& bytes, Grammar::Stacks* into) const {
  bool any = false;
  for (size_t i = 0; i < stacks_.size(); ++i) {
    Reset(bytes.size());
    levels_[0].stacks = &OneParse(i);
    size_t k = 0;
    while (k < bytes.size() && Step(k, static_cast<unsigned char>(bytes[k]))) ++k;
    if (k < bytes.size() || !CanEnd(k)) continue;
    if (into == nullptr) return true;
    any = true;
    const Grammar::Stacks& next = *levels_[k].stacks;
    for (size_t j = 0; j < next.size() && into->size() < Grammar::kMaxStacks; ++j) {
      stack_.assign(next.data.begin() + (j == 0 ? 0 : next.end[j - 1]),
                    next.data.begin() + next.end[j]);
      into->AddUnique(stack_);
    }
  }
  return any;
}

void GrammarConstraint::AllowedTokens(int vocab, std::vector<uint8_t>* allowed) const {
  if (dead_ || table_->sorted.empty()) return TokenConstraint::AllowedTokens(vocab, allowed);
  Reset(table_->max_bytes);
  scan_left_ = budget_;
  const auto step = [&](size_t k, unsigned char c) { return Step(k, c); };
  const auto can_end = [&](size_t k) { return CanEnd(k); };
  if (!PerParse()) {
    ScanTokenTable(*table_, vocab, Complete(), step, can_end, allowed);
  } else {
    // One walk per open parse (a token is allowed when some parse takes it, as llama.cpp
    // matches), each skipping the tokens an earlier parse allowed: when many parses take the
    // same tokens, those are walked once instead of once per parse at every byte.
    levels_[0].stacks = &OneParse(0);
    ScanTokenTable(*table_, vocab, Complete(), step, can_end, allowed);
    for (size_t i = 1; i < stacks_.size() && scan_left_ > 1; ++i) {
      levels_[0].stacks = &OneParse(i);
      ScanTokenTable</*kAccumulate=*/true>(*table_, vocab, false, step, can_end, allowed);
    }
  }
  if (scan_left_ <= 1) over_budget_ = true;
  scan_left_ = 0;
}

absl::Status GrammarConstraint::status() const {
  if (!over_budget_) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "grammar: matching the vocabulary against it took more than ", budget_,
      " rule expansions for one token (too many parses open at once); simplify the grammar"));
}

void GrammarConstraint::Accept(int32_t id) {
  if (id < 0 || static_cast<size_t>(id) >= table_->kind.size() ||
      table_->kind[id] != TokenTable::kNormal) {
    return;
  }
  const std::string& bytes = table_->bytes[id];
  if (dead_) return;
  if (Feed(bytes)) {
    const Level& last = levels_[bytes.size()];
    utf8_ = last.utf8;
    if (last.stacks != &stacks_) stacks_ = *last.stacks;
    return;
  }
  if (PerParse()) {
    // All the parses together would pass a cap on the way, but some parse on its own takes
    // the token (as AllowedTokens and Allows judge with this many open): keep the first
    // kMaxStacks parses it leads to.
    Grammar::Stacks next;
    if (FeedEach(bytes, &next)) {
      utf8_ = levels_[bytes.size()].utf8;
      stacks_ = std::move(next);
      return;
    }
  }
  // The sampler found no token the grammar allows (kMaxStacks): end the output.
  dead_ = true;
}

}  // namespace tinyserve
