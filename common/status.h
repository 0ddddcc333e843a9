// File: common/status.h
// Recoverable errors are absl::Status / absl::StatusOr<T>; codes follow gRPC semantics (bad input:
// InvalidArgument naming the field; out of pages or queue space: ResourceExhausted; draining:
// Unavailable). The Abseil release on Debian 12 (20220623) has no RETURN_IF_ERROR macros, so these
// are the local equivalents.
//
//   TS_RETURN_IF_ERROR(file.Seek(offset));
//   TS_ASSIGN_OR_RETURN(auto header, ReadHeader(file));
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

#define TS_STATUS_CONCAT_INNER_(a, b) a##b
#define TS_STATUS_CONCAT_(a, b) TS_STATUS_CONCAT_INNER_(a, b)

#define TS_RETURN_IF_ERROR(expr)                  \
  do {                                            \
    ::absl::Status ts_status_ = (expr);           \
    if (!ts_status_.ok()) return ts_status_;      \
  } while (0)

#define TS_ASSIGN_OR_RETURN(lhs, expr) \
  TS_ASSIGN_OR_RETURN_IMPL_(TS_STATUS_CONCAT_(ts_statusor_, __LINE__), lhs, expr)

#define TS_ASSIGN_OR_RETURN_IMPL_(var, lhs, expr) \
  auto var = (expr);                              \
  if (!var.ok()) return std::move(var).status();  \
  lhs = std::move(var).value()
