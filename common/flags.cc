#include "common/flags.h"

#include <charconv>
#include <cstdlib>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace tinyserve {

FlagSet::FlagSet(std::string command, std::string summary)
    : command_(std::move(command)), summary_(std::move(summary)) {}

void FlagSet::Add(Flag flag) {
  // Two flags of one name would leave one unreachable (the later wins): a programming error.
  for (const Flag& f : flags_)
    TS_CHECK(f.name != flag.name) << "flag --" << flag.name << " registered twice";
  flags_.push_back(std::move(flag));
}

void FlagSet::String(const std::string& name, std::string* value, const std::string& help) {
  Add({name, help, *value, false, [value](const std::string& s) {
         *value = s;
         return absl::OkStatus();
       }});
}

void FlagSet::Int(const std::string& name, int* value, const std::string& help) {
  Add({name, help, std::to_string(*value), false, [value, name](const std::string& s) {
         if (!absl::SimpleAtoi(s, value))
           return absl::InvalidArgumentError(
               absl::StrCat("--", name, ": expected an integer, got '", s, "'"));
         return absl::OkStatus();
       }});
}

void FlagSet::Int64(const std::string& name, int64_t* value, const std::string& help) {
  Add({name, help, std::to_string(*value), false, [value, name](const std::string& s) {
         if (!absl::SimpleAtoi(s, value))
           return absl::InvalidArgumentError(
               absl::StrCat("--", name, ": expected an integer, got '", s, "'"));
         return absl::OkStatus();
       }});
}

void FlagSet::Float(const std::string& name, float* value, const std::string& help) {
  std::ostringstream d;
  d << *value;
  Add({name, help, d.str(), false, [value, name](const std::string& s) {
         if (!absl::SimpleAtof(s, value))
           return absl::InvalidArgumentError(
               absl::StrCat("--", name, ": expected a number, got '", s, "'"));
         return absl::OkStatus();
       }});
}

void FlagSet::Double(const std::string& name, double* value, const std::string& help) {
  std::ostringstream d;
  d << *value;
  Add({name, help, d.str(), false, [value, name](const std::string& s) {
         if (!absl::SimpleAtod(s, value))
           return absl::InvalidArgumentError(
               absl::StrCat("--", name, ": expected a number, got '", s, "'"));
         return absl::OkStatus();
       }});
}

void FlagSet::Bool(const std::string& name, bool* value, const std::string& help) {
  Add({name, help, *value ? "true" : "false", true, [value, name](const std::string& s) {
         if (s == "true" || s == "1" || s.empty()) {
           *value = true;
         } else if (s == "false" || s == "0") {
           *value = false;
         } else {
           return absl::InvalidArgumentError(
               absl::StrCat("--", name, ": expected true or false, got '", s, "'"));
         }
         return absl::OkStatus();
       }});
}

void FlagSet::StringList(const std::string& name, std::vector<std::string>* value,
                         const std::string& help) {
  Add({name, help, "", false, [value](const std::string& s) {
         value->push_back(s);
         return absl::OkStatus();
       }});
}

bool FlagSet::WasSet(const std::string& name) const {
  for (const auto& s : set_)
    if (s == name) return true;
  return false;
}

absl::Status FlagSet::Parse(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      help_ = true;
      continue;
    }
    if (a.size() < 3 || a[0] != '-' || a[1] != '-') {
      positional_.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    Flag* flag = nullptr;
    for (auto& f : flags_)
      if (f.name == name) flag = &f;
    if (flag == nullptr && name.rfind("no-", 0) == 0) {
      for (auto& f : flags_)
        if (f.is_bool && f.name == name.substr(3)) flag = &f;
      if (flag != nullptr) {
        name = name.substr(3);
        value = "false";
        has_value = true;
      }
    }
    if (flag == nullptr)
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name, " for '", command_, "' (see --help)"));
    if (!has_value && !flag->is_bool) {
      if (i + 1 >= args.size())
        return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      value = args[++i];
    }
    if (auto s = flag->set(value); !s.ok()) return s;
    set_.push_back(name);
  }
  return absl::OkStatus();
}

std::string FlagSet::Usage() const {
  std::ostringstream out;
  out << "usage: tinyserve " << command_ << " [flags]\n\n" << summary_ << "\n\nflags:\n";
  for (const auto& f : flags_) {
    out << "  --" << f.name << (f.is_bool ? "" : " VALUE");
    if (!f.default_text.empty()) out << "  (default: " << f.default_text << ")";
    out << "\n      " << f.help << "\n";
  }
  out << "  --help\n      print this help\n";
  return out.str();
}

}  // namespace tinyserve
