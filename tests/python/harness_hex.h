// Hex strings for the libllama harnesses' line protocols (llamacpp_sampler.cpp,
// llamacpp_grammar.cpp): bytes travel as lowercase hex, "-" for none.
#pragma once

#include <cstdlib>
#include <string>

static inline std::string unhex(const std::string & h) {
    std::string out;
    for (size_t i = 0; i + 1 < h.size(); i += 2) {
        out += (char) strtol(h.substr(i, 2).c_str(), nullptr, 16);
    }
    return out;
}

static inline std::string hex(const std::string & s) {
    static const char * digits = "0123456789abcdef";
    std::string out;
    for (unsigned char c : s) {
        out += digits[c >> 4];
        out += digits[c & 15];
    }
    return out.empty() ? "-" : out;
}
