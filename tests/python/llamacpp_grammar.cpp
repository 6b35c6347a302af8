// llama.cpp's grammar sampler over a whole vocabulary: the oracle of Muser's grammar engine
// (crates/muser-grammar), driven by tests/python/test_grammar_llamacpp.py.
//
// --vocab MODEL loads MODEL's vocabulary (vocab_only). Then:
//   --pieces    prints `HEX EOG` per token: its text as the grammar sampler sees it
//               (llama_token_to_piece with special = true; `-` for an empty piece) and 1 when
//               llama_vocab_is_eog, else 0. Muser's side builds its Vocab from this file.
//   --tokenize  reads hex texts on stdin and prints `HEX ID` for each: the token the text is
//               when it tokenizes (special tokens parsed, as a grammar's <text> reference is)
//               to exactly one token, else -1.
//   (none)      reads scenarios, one a line: `seed=S steps=N grammar=HEX [verbose=1]`, and
//               prints one line per scenario: `refused` when llama_sampler_init_grammar fails,
//               else one record per step, space-separated, `COUNT:HASH:PICK`: the number of
//               tokens left finite by llama_sampler_apply over the whole vocabulary, an FNV-1a
//               hash of their ids in order, and the token picked (the k-th allowed, k from a
//               splitmix64 seeded with S). The pick is accepted (llama_sampler_accept) and the
//               next step follows, N steps at most; PICK is `end` when an end-of-generation
//               token was picked (the scenario stops), `err:ID` when accepting token ID threw
//               (llama.cpp refuses a token its own apply allowed: the scenario stops), `none`
//               when nothing is allowed. With verbose=1 each record ends with `:` and the
//               comma-separated allowed ids.
// Muser's side is crates/muser-grammar/examples/grammar_io.rs, same input, same output.
//
// Build: g++ -O2 -std=c++17 -I$SRC/include -I$SRC/ggml/include llamacpp_grammar.cpp
//        -L$BIN -lllama -Wl,-rpath,$BIN

#include "llama.h"
#include "harness_hex.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>


struct SplitMix {
    uint64_t s;
    uint64_t next() {
        s += 0x9e3779b97f4a7c15ULL;
        uint64_t z = s;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
    }
};

static uint64_t fnv(const std::vector<llama_token> & ids) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (llama_token t : ids) {
        uint32_t v = (uint32_t) t;
        for (int k = 0; k < 4; ++k) {
            h ^= (v >> (8 * k)) & 0xff;
            h *= 0x100000001b3ULL;
        }
    }
    return h;
}

static std::string piece(const llama_vocab * vocab, llama_token t) {
    std::string text(64, '\0');
    int n = llama_token_to_piece(vocab, t, &text[0], (int32_t) text.size(), 0, true);
    if (n < 0) {
        text.resize(-n);
        n = llama_token_to_piece(vocab, t, &text[0], (int32_t) text.size(), 0, true);
    }
    text.resize(n);
    return text;
}

static std::string run(const llama_vocab * vocab, const std::string & line) {
    std::map<std::string, std::string> kv;
    std::istringstream in(line);
    std::string tok;
    while (in >> tok) {
        size_t eq = tok.find('=');
        if (eq == std::string::npos) {
            throw std::runtime_error("not key=value: " + tok);
        }
        kv[tok.substr(0, eq)] = tok.substr(eq + 1);
    }
    uint64_t seed = strtoull(kv.at("seed").c_str(), nullptr, 10);
    int steps = atoi(kv.at("steps").c_str());
    std::string grammar = unhex(kv.at("grammar"));
    bool verbose = kv.count("verbose") && kv["verbose"] == "1";

    llama_sampler * smpl = llama_sampler_init_grammar(vocab, grammar.c_str(), "root");
    if (smpl == nullptr) {
        return "refused";
    }
    const int n_vocab = llama_vocab_n_tokens(vocab);
    std::vector<llama_token_data> data(n_vocab);
    SplitMix rng{seed};
    std::string out;
    for (int step = 0; step < steps; ++step) {
        for (int i = 0; i < n_vocab; ++i) {
            data[i] = {i, 0.0f, 0.0f};
        }
        llama_token_data_array cur = {data.data(), data.size(), -1, false};
        llama_sampler_apply(smpl, &cur);
        std::vector<llama_token> allowed;
        for (size_t i = 0; i < cur.size; ++i) {
            if (!std::isinf(cur.data[i].logit)) {
                allowed.push_back(cur.data[i].id);
            }
        }
        // apply keeps the order of the array, which is by id here.
        char head[64];
        snprintf(head, sizeof head, "%zu:%016llx:", allowed.size(), (unsigned long long) fnv(allowed));
        out += (step ? " " : "") + std::string(head);
        std::string list;
        if (verbose) {
            for (size_t i = 0; i < allowed.size(); ++i) {
                list += (i ? "," : "") + std::to_string(allowed[i]);
            }
        }
        if (allowed.empty()) {
            out += "none" + std::string(verbose ? ":" : "");
            break;
        }
        llama_token pick = allowed[rng.next() % allowed.size()];
        bool stop = false;
        if (llama_vocab_is_eog(vocab, pick)) {
            out += "end";
            stop = true;
        } else {
            try {
                llama_sampler_accept(smpl, pick);
                out += std::to_string(pick);
            } catch (const std::exception &) {
                out += "err:" + std::to_string(pick);
                stop = true;
            }
        }
        if (verbose) {
            out += ":" + list;
        }
        if (stop) {
            break;
        }
    }
    llama_sampler_free(smpl);
    return out;
}

int main(int argc, char ** argv) {
    std::string mode;
    const llama_vocab * vocab = nullptr;
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    for (int a = 1; a < argc; ++a) {
        std::string arg = argv[a];
        if (arg == "--vocab" && a + 1 < argc) {
            llama_model_params mp = llama_model_default_params();
            mp.vocab_only = true;
            llama_model * model = llama_model_load_from_file(argv[++a], mp);
            if (model == nullptr) {
                fprintf(stderr, "llamacpp_grammar: cannot load the vocabulary of %s\n", argv[a]);
                return 1;
            }
            vocab = llama_model_get_vocab(model);
        } else if (arg == "--pieces" || arg == "--tokenize") {
            mode = arg;
        } else {
            fprintf(stderr, "usage: llamacpp_grammar --vocab MODEL [--pieces | --tokenize]\n");
            return 2;
        }
    }
    if (vocab == nullptr) {
        fprintf(stderr, "llamacpp_grammar: --vocab MODEL is required\n");
        return 2;
    }
    if (mode == "--pieces") {
        for (llama_token t = 0; t < llama_vocab_n_tokens(vocab); ++t) {
            std::cout << hex(piece(vocab, t)) << " " << (llama_vocab_is_eog(vocab, t) ? 1 : 0) << "\n";
        }
        return 0;
    }
    if (mode == "--tokenize") {
        std::string h;
        while (std::getline(std::cin, h)) {
            std::string text = unhex(h);
            std::vector<llama_token> toks(text.size() + 8);
            int n = llama_tokenize(vocab, text.data(), (int32_t) text.size(), toks.data(), (int32_t) toks.size(),
                                   false, true);
            std::cout << h << " " << (n == 1 ? toks[0] : -1) << "\n";
        }
        return 0;
    }
    std::string line;
    int lineno = 0;
    while (std::getline(std::cin, line)) {
        ++lineno;
        try {
            std::cout << run(vocab, line) << "\n" << std::flush;
        } catch (const std::exception & e) {
            fprintf(stderr, "llamacpp_grammar: line %d: %s\n", lineno, e.what());
            return 1;
        }
    }
    return 0;
}
