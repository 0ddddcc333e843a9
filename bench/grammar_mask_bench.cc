// Full-vocabulary grammar masks (GrammarConstraint::AllowedTokens) with SmolLM2-135M-Instruct's
// 49,152 tokens, at states that keep few and many parses open. The engine computes one when a
// drawn token does not fit. Needs the default model (scripts/setup downloads it).
//   build/bin/grammar_mask_bench
#include <benchmark/benchmark.h>

#include <cstdio>
#include <memory>
#include <string>

#include "common/paths.h"
#include "worker/engine/engine.h"
#include "worker/model/weight_source.h"
#include "worker/sampling/grammar.h"

namespace tinyserve {
namespace {

std::shared_ptr<const TokenTable> Table() {
  static std::shared_ptr<const TokenTable> table = [] {
    auto src = OpenWeightSource(DefaultModelPath());
    if (!src.ok()) return std::shared_ptr<const TokenTable>();
    auto tok = Tokenizer::Create((*src)->tokenizer_data());
    return tok.ok() ? MakeTokenTable(**tok) : std::shared_ptr<const TokenTable>();
  }();
  return table;
}

// The mask after `text` (fed byte by byte through the vocabulary's single-byte tokens).
void Mask(benchmark::State& state, const char* grammar, const std::string& text) {
  const auto table = Table();
  if (table == nullptr) return state.SkipWithError("no default model (scripts/setup)");
  auto g = Grammar::Compile(grammar);
  if (!g.ok()) return state.SkipWithError(std::string(g.status().message()).c_str());
  GrammarConstraint c(table, *g);
  for (char ch : text) {
    int32_t id = -1;
    for (int32_t t = 0; t < static_cast<int32_t>(table->bytes.size()) && id < 0; ++t) {
      if (table->kind[t] == TokenTable::kNormal && table->bytes[t] == std::string(1, ch)) id = t;
    }
    if (id < 0 || !c.Allows(id)) return state.SkipWithError("text does not fit the grammar");
    c.Accept(id);
  }
  std::vector<uint8_t> allowed;
  const int vocab = static_cast<int>(table->kind.size());
  for (auto _ : state) {
    c.AllowedTokens(vocab, &allowed);
    benchmark::DoNotOptimize(allowed.data());
  }
  int n = 0;
  for (uint8_t a : allowed) n += a;
  state.counters["allowed"] = n;
}

const char kJson[] =
    "root ::= object\n"
    "object ::= \"{\" ws ( member ( \",\" ws member )* )? \"}\"\n"
    "member ::= string ws \":\" ws value ws\n"
    "value ::= object | string | [0-9]+ | \"true\" | \"false\" | \"null\"\n"
    "string ::= \"\\\"\" [^\"\\\\]* \"\\\"\"\n"
    "ws ::= [ \\t\\n]*\n";
const char kWords[] = "root ::= [a-z]{0,60} \" \" [a-z]{0,60} \" \" [a-z]{0,60}\n";
// Three runs of letters with nothing between them: after n letters, every split of them into
// the three runs is a parse of its own (hundreds open at once).
const char kRuns[] = "root ::= [a-z]{0,60} [a-z]{0,60} [a-z]{0,60}\n";
// Each "a" doubles the open parses (their closing letters differ): after nine, 512 are open,
// the most that are matched one by one (GrammarConstraint::kMaxPerParse).
const char kDoubling[] = "root ::= x\nx ::= \"a\" x \"b\" | \"a\" x \"c\" | \"\"\n";
const char kList[] = "root ::= (\"- \" [A-Z] [a-z]{1,12} \"\\n\"){3}\n";

void BM_JsonInString(benchmark::State& s) { Mask(s, kJson, "{\"name\": \"Ad"); }
void BM_JsonAfterValue(benchmark::State& s) { Mask(s, kJson, "{\"a\": 12"); }
void BM_ListItem(benchmark::State& s) { Mask(s, kList, "- Apple\n- B"); }
void BM_WordsOneParse(benchmark::State& s) { Mask(s, kWords, "hello"); }
void BM_RunsManyParses(benchmark::State& s) { Mask(s, kRuns, std::string(60, 'a')); }
void BM_Doubling512Parses(benchmark::State& s) { Mask(s, kDoubling, std::string(9, 'a')); }
BENCHMARK(BM_JsonInString)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_JsonAfterValue)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ListItem)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_WordsOneParse)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_RunsManyParses)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Doubling512Parses)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace tinyserve

BENCHMARK_MAIN();
