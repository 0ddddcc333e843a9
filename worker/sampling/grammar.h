// File: worker/sampling/grammar.h
// GBNF grammars (llama.cpp's format) for constrained decoding: llama.cpp server's "grammar"
// field, vLLM's guided_grammar and structured_outputs.grammar, gRPC's response_format "grammar".
//
//   root   ::= "yes" | "no" | answer
//   answer ::= [A-Z] [a-z]{2,8} ("." | "!")? ws   # comments run to the end of the line
//   ws     ::= [ \t\n]*
//
// Syntax as llama.cpp's grammars/README.md: rules `name ::= alternatives` (names of letters,
// digits, '-' and '_'), literals "..." and classes [a-z] / [^...] with the escapes \n \r \t,
// \\ \" \[ \] \- \xHH \uHHHH \UHHHHHHHH, "." for any code point, groups ( ), alternatives |,
// repetitions * + ? {m} {m,} {m,n}; a rule continues past a newline inside ( ) or after '|'.
// The whole output matches `root`. Refused with an error naming the line and column: syntax
// errors, undefined rules, rules defined twice, no root, left recursion as llama.cpp finds it
// (a rule reached again through leftmost references, each before it having an empty
// alternative of its own), a repetition count over kMaxRepeat, grammars past kMaxElements once
// repetitions are written out, and token references (<[id]>, <text>). Alternatives that can never
// finish (through a rule that only recurses) are dropped, so no accepted prefix is a dead end.
//
// Matching is llama.cpp's: a set of open parses ("stacks" of positions into the rules), each
// code point advancing every parse whose next terminal accepts it. A grammar so ambiguous that
// more than kMaxStacks parses stay open, or that needs more than kMaxExpand rule expansions for
// one code point, refuses the code point that would pass the cap, except that with
// kWalkPerParse to kMaxPerParse parses open a token is judged against each parse on its own
// (as llama.cpp does), and taking it keeps the first kMaxStacks parses it leads to; a
// vocabulary mask that would
// take more than kMaxScan expansions (about 2 s) ends the output with RESOURCE_EXHAUSTED
// (status()) rather than guess. Recursion depth is bounded (kMaxNesting while parsing,
// kMaxChain while matching), so no grammar can exhaust a thread's stack.
//
// Thread safety: a compiled Grammar is immutable (shared); recognizers are per request.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/sampling/json_constraint.h"

namespace tinyserve {

class Grammar {
 public:
  static constexpr int kMaxRepeat = 2000;  // as llama.cpp: {m,n} with n over it has no maximum
  static constexpr int kMaxElements = 200000;
  static constexpr size_t kMaxText = 256 * 1024;
  static constexpr int kMaxNesting = 256;       // parentheses inside parentheses
  static constexpr int kMaxChain = 1000;        // rules entered (nested) before a character matches
  static constexpr int kMaxStacks = 4096;       // parses open at once
  static constexpr int64_t kMaxExpand = 20000;  // rule expansions for one code point
  static constexpr int64_t kMaxScan = 64000000;  // rule expansions for one vocabulary mask

  // INVALID_ARGUMENT saying what is wrong and where ("line 2, column 7: expecting ::=").
  static absl::StatusOr<std::shared_ptr<const Grammar>> Compile(std::string_view text);

  // Open parses, flattened: stack i is data[end[i - 1] .. end[i]), its back the position of
  // the next terminal; an empty stack is a finished parse.
  struct Stacks {
    std::vector<int32_t> data;
    std::vector<uint32_t> end;
    std::vector<uint64_t> hash;   // per stack
    std::vector<uint32_t> slots;  // open addressing over the stacks (index + 1), once 16 or more
    size_t size() const { return end.size(); }
    bool empty() const { return end.empty(); }
    void clear() {
      data.clear();
      end.clear();
      hash.clear();
      std::fill(slots.begin(), slots.end(), 0);
    }
    // Appends `stack` unless an equal one is there; true when appended. Past kIndexed stacks
    // it looks them up by hash instead of scanning.
    bool AddUnique(const std::vector<int32_t>& stack);

   private:
    static constexpr size_t kIndexed = 16;
    void Place(size_t i);
  };
  // Scratch for Advance: the stack being expanded, and the states already expanded (so a cycle
  // through rules that can match empty text ends, as llama.cpp's `seen` set ends it).
  struct Scratch {
    std::vector<int32_t> work;
    Stacks seen;
  };
  const Stacks& start() const { return start_; }
  // The parses after code point cp (none: `to` ends empty). `to` must not be `from`; *budget
  // (rule expansions) is spent, and running out ends with none, as does passing kMaxStacks.
  void Advance(const Stacks& from, char32_t cp, Stacks* to, Scratch* scratch,
               int64_t* budget) const;
  // Some parse's next terminal accepts a code point in [lo, hi].
  bool AnyIn(const Stacks& stacks, char32_t lo, char32_t hi) const;
  // Some parse is finished.
  static bool Finished(const Stacks& stacks);

  int num_elements() const { return static_cast<int>(elems_.size()); }

 private:
  struct Elem {
    enum Kind : uint8_t { kEnd, kChars, kRef };
    Kind kind;
    int32_t value;  // kChars: index into sets_; kRef: rule
  };
  // Code point ranges [lo, hi], sorted, disjoint.
  using CharSet = std::vector<std::pair<char32_t, char32_t>>;
  static bool Contains(const CharSet& set, char32_t cp);

  // Pushes the parses that s->work stands for onto `to`, expanding rule references on its top
  // until a terminal (or nothing) is on top; a state already expanded (s->seen) adds nothing
  // new and is skipped. Leaves s->work as it found it. Stops early once
  // *budget (one per call) runs out or `to` passes kMaxStacks; recursing past kMaxChain spends
  // the whole budget.
  void Expand(Scratch* s, Stacks* to, int64_t* budget, int depth = 0) const;

  std::vector<Elem> elems_;                 // every alternative's elements, each run ended by kEnd
  std::vector<std::vector<int32_t>> alts_;  // per rule: where its alternatives start
  std::vector<CharSet> sets_;
  Stacks start_;
  friend class GrammarBuilder;
};

// Which tokens may come next under a grammar: a token whose bytes continue some parse (a code
// point split across tokens is checked against what its first bytes allow); end-of-generation
// only once some parse is finished; other special tokens never. Nothing is copied per
// candidate: bytes advance through scratch levels, and AllowedTokens walks the table's sorted
// tokens as a trie, matching a shared prefix once and skipping every token behind a dead one.
class GrammarConstraint final : public TokenConstraint {
 public:
  GrammarConstraint(std::shared_ptr<const TokenTable> table, std::shared_ptr<const Grammar> g,
                    int64_t scan_budget = Grammar::kMaxScan)
      : table_(std::move(table)), g_(std::move(g)), stacks_(g_->start()), budget_(scan_budget) {}

  bool Allows(int32_t id) const override;
  void AllowedTokens(int vocab, std::vector<uint8_t>* allowed) const override;
  void Accept(int32_t id) override;
  absl::Status status() const override;
  bool Complete() const { return utf8_.left == 0 && Grammar::Finished(stacks_); }

 private:
  struct Utf8 {
    uint32_t value = 0;  // the bits of the code point so far
    uint8_t left = 0;    // continuation bytes still to come
    uint8_t length = 0;  // bytes of the code point being read
  };
  // The state after some bytes: the open parses (own, or an earlier level's while a code point
  // is incomplete) and the code point being read.
  struct Level {
    const Grammar::Stacks* stacks = nullptr;
    Utf8 utf8;
    Grammar::Stacks own;
  };
  // levels_[0] = the committed state, with room for `bytes` more levels.
  void Reset(size_t bytes) const;
  // levels_[k + 1] from levels_[k] and byte c; false when no parse can take it.
  bool Step(size_t k, unsigned char c) const;
  // A token may end at levels_[k]: a code point it leaves incomplete can still be taken.
  bool CanEnd(size_t k) const;
  // Feeds a token's bytes through the levels; true when all are taken and it may end there.
  bool Feed(const std::string& bytes) const;
  // The same for each open parse on its own: true when some parse takes the token; `into`
  // (unless null) then gets the parses they lead to, the first kMaxStacks of them.
  bool FeedEach(const std::string& bytes, Grammar::Stacks* into) const;

  std::shared_ptr<const TokenTable> table_;
  std::shared_ptr<const Grammar> g_;
  Grammar::Stacks stacks_;
  Utf8 utf8_;
  bool dead_ = false;  // a token no parse allowed was accepted: only end-of-generation now
  // With kWalkPerParse to kMaxPerParse open parses, tokens are judged against each parse on
  // its own: AllowedTokens walks the vocabulary once per parse, skipping the tokens an
  // earlier one allowed. (Each walk visits the whole sorted table, so more parses than
  // kMaxPerParse are matched together.)
  static constexpr size_t kWalkPerParse = 8;
  static constexpr size_t kMaxPerParse = 512;
  bool PerParse() const {
    return stacks_.size() >= kWalkPerParse && stacks_.size() <= kMaxPerParse;
  }
  mutable std::vector<Level> levels_;
  mutable Grammar::Stacks one_;         // one parse at a time (OneParse)
  mutable std::vector<int32_t> stack_;  // and its scratch
  // one_ = open parse i alone.
  const Grammar::Stacks& OneParse(size_t i) const;
  mutable Grammar::Scratch scratch_;
  mutable int64_t scan_left_ = 0;  // AllowedTokens' expansions left (0: not scanning)
  const int64_t budget_;           // rule expansions a mask may take (kMaxScan)
  mutable bool over_budget_ = false;  // a mask ran out of them: status() says so
};

}  // namespace tinyserve
