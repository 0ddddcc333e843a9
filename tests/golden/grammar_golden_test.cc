// GBNF grammars against llama.cpp (tests/golden/grammar/grammar_masks.json, made by
// scripts/make_grammar_goldens.py with llama-cpp-python): with SmolLM2-135M-Instruct's
// vocabulary, before each token of a text the grammar matches and after the last, the set of
// tokens GrammarConstraint allows equals the set llama.cpp's grammar sampler leaves allowed
// (count and hash of the ids, the ids themselves when few), and end-of-generation is allowed
// exactly when llama.cpp allows it. Control tokens are left out: llama.cpp matches their text
// against the grammar, TinyServe never lets a special token through one. Skips when the model
// is not downloaded (scripts/setup downloads it).
#include <fstream>
#include <set>

#include "common/paths.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/engine/engine.h"
#include "worker/model/weight_source.h"
#include "worker/sampling/grammar.h"

namespace tinyserve {
namespace {

std::string Fnv1a(const std::vector<int32_t>& ids) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (int32_t id : ids) {
    for (int b = 0; b < 4; ++b) {
      h ^= (static_cast<uint32_t>(id) >> (8 * b)) & 0xFF;
      h *= 0x100000001b3ULL;
    }
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

TEST(GrammarGolden, TokenMasksMatchLlamaCpp) {
  if (!FileExists(DefaultModelPath())) GTEST_SKIP() << "no " << DefaultModelPath();
  std::ifstream in("tests/golden/grammar/grammar_masks.json");
  ASSERT_TRUE(in.good()) << "run from the source root";
  const nlohmann::json golden = nlohmann::json::parse(in);
  auto src = OpenWeightSource(DefaultModelPath());
  ASSERT_TRUE(src.ok()) << src.status();
  auto tok = Tokenizer::Create((*src)->tokenizer_data());
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::shared_ptr<const TokenTable> table = MakeTokenTable(**tok);
  ASSERT_EQ(static_cast<int>(table->kind.size()), golden["vocab_size"].get<int>());
  // Left out of the comparison: llama.cpp's control and end-of-generation tokens (its
  // end-of-generation set also takes <reponame> by its name heuristics), and tokens whose text
  // starts with a NUL byte, which llama.cpp refuses as an empty C string (TinyServe lets "\0"
  // through a class that holds it, as vLLM's decoders do).
  std::set<int32_t> skip;
  for (int32_t id : golden["control"]) skip.insert(id);
  for (int32_t id : golden["eog"]) skip.insert(id);
  std::vector<int32_t> eog_ids;
  for (int32_t id = 0; id < static_cast<int32_t>(table->kind.size()); ++id) {
    if (!table->bytes[id].empty() && table->bytes[id][0] == '\0') skip.insert(id);
    if (table->kind[id] == TokenTable::kEnd) eog_ids.push_back(id);
  }
  ASSERT_FALSE(eog_ids.empty());
  int steps = 0;
  for (const auto& c : golden["cases"]) {
    const std::string name = c["name"];
    auto g = Grammar::Compile(c["grammar"].get<std::string>());
    ASSERT_TRUE(g.ok()) << name << ": " << g.status();
    GrammarConstraint constraint(table, *g);
    const std::vector<int32_t> ids = c["ids"];
    ASSERT_EQ(c["steps"].size(), ids.size() + 1);
    for (size_t k = 0; k <= ids.size(); ++k, ++steps) {
      const auto& want = c["steps"][k];
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < static_cast<int32_t>(table->kind.size()); ++id) {
        if (table->kind[id] == TokenTable::kNormal && !skip.count(id) && constraint.Allows(id)) {
          allowed.push_back(id);
        }
      }
      const std::string where = name + " before token " + std::to_string(k);
      // The trie walk over the sorted table says the same as one token at a time.
      std::vector<uint8_t> scan;
      constraint.AllowedTokens(static_cast<int>(table->kind.size()), &scan);
      std::vector<int32_t> scanned;
      for (int32_t id = 0; id < static_cast<int32_t>(scan.size()); ++id) {
        if (scan[id] && table->kind[id] == TokenTable::kNormal && !skip.count(id)) {
          scanned.push_back(id);
        }
      }
      EXPECT_EQ(scanned, allowed) << where;
      EXPECT_EQ(static_cast<int64_t>(allowed.size()), want["count"].get<int64_t>()) << where;
      EXPECT_EQ(Fnv1a(allowed), want["fnv1a"].get<std::string>()) << where;
      if (want.contains("ids")) {
        EXPECT_EQ(allowed, want["ids"].get<std::vector<int32_t>>()) << where;
      }
      bool eog = false;
      for (int32_t id : eog_ids) eog = eog || constraint.Allows(id);
      EXPECT_EQ(eog, want["eog"].get<bool>()) << where;
      if (k < ids.size()) {
        ASSERT_TRUE(constraint.Allows(ids[k])) << where;
        constraint.Accept(ids[k]);
      }
    }
  }
  EXPECT_GT(steps, 70);
}

// With many parses open (GrammarConstraint::kWalkPerParse to kMaxPerParse), the mask walks the
// vocabulary once per parse, skipping what an earlier parse allowed: on the real vocabulary
// (multi-byte tokens sharing prefixes), it equals asking token by token.
TEST(GrammarGolden, PerParseMasksEqualTokenByToken) {
  if (!FileExists(DefaultModelPath())) GTEST_SKIP() << "no " << DefaultModelPath();
  auto src = OpenWeightSource(DefaultModelPath());
  ASSERT_TRUE(src.ok()) << src.status();
  auto tok = Tokenizer::Create((*src)->tokenizer_data());
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::shared_ptr<const TokenTable> table = MakeTokenTable(**tok);
  const int vocab = static_cast<int>(table->kind.size());
  auto single = [&](char c) {
    for (int32_t id = 0; id < vocab; ++id) {
      if (table->kind[id] == TokenTable::kNormal && table->bytes[id] == std::string(1, c))
        return id;
    }
    return -1;
  };
  const struct {
    const char* grammar;
    std::string text;
  } cases[] = {
      // Every parse takes the same letters (later walks skip them all).
      {"root ::= [a-z]{0,20} [a-z]{0,20} [a-z]{0,20}", std::string(12, 'e')},
      // Each parse closes with its own sequence of b and c (tokens such as "bc", "cb", "abc").
      {"root ::= x\nx ::= \"a\" x \"b\" | \"a\" x \"c\" | \"\"", std::string(6, 'a')},
      {"root ::= x\nx ::= \"a\" x \"b\" | \"a\" x \"c\" | \" \" x \"d\" | \"\"", "aa a a"},
  };
  for (const auto& c : cases) {
    auto g = Grammar::Compile(c.grammar);
    ASSERT_TRUE(g.ok()) << g.status();
    GrammarConstraint constraint(table, *g);
    for (char ch : c.text) {
      const int32_t id = single(ch);
      ASSERT_TRUE(id >= 0 && constraint.Allows(id)) << c.grammar;
      constraint.Accept(id);
    }
    std::vector<uint8_t> scan;
    constraint.AllowedTokens(vocab, &scan);
    int allowed = 0;
    for (int32_t id = 0; id < vocab; ++id) {
      EXPECT_EQ(scan[id] != 0, constraint.Allows(id))
          << c.grammar << " token " << id << " '" << table->bytes[id] << "'";
      allowed += scan[id];
    }
    EXPECT_GT(allowed, 1) << c.grammar;
  }
}

}  // namespace
}  // namespace tinyserve
