// File: worker/server/block_hash.h
// Chained hashes of a prompt's leading blocks, computed the same way by the router (to keep
// its approximate per-worker prefix index) and by the worker (to report a PrefixSummary).
//
// The router does not tokenize, so it hashes what it has: text prompts in blocks of
// kTextBlockBytes bytes, token-id prompts in blocks of kTokenBlockSize ids, chat prompts as
// their messages serialized to text (role, 0x1F, content, 0x1E per message: the whole
// conversation, not only its first turn). Block i's hash covers blocks 0..i (it is seeded with
// block i-1's hash), so two prompts share their first k hashes exactly when they share their
// first k blocks. Only full blocks are hashed. The hash is deterministic across processes.
// A request's cache_salt and LoRA adapter seed the chain, so salted prompts match only the same
// salt, and an adapter's prompts only the same adapter's (its KV pages differ from the base's).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "tinyserve/v1/tinyserve.pb.h"

namespace tinyserve {

inline constexpr int kTextBlockBytes = 64;  // about one 16-token KV page of English text
inline constexpr int kTokenBlockSize = 16;  // one default KV page

// The seed of a prompt's hash chains for a cache_salt: 0 for none (the engine's page hashes
// start from it too, worker/engine/engine.h GenerateRequest::cache_salt).
uint64_t CacheSaltSeed(std::string_view salt);

// The chained block hashes of the request's prompt (empty when shorter than one block).
std::vector<uint64_t> PromptBlockHashes(const tinyserve::v1::GenerateRequest& request);

}  // namespace tinyserve
