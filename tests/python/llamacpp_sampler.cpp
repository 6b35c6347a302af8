// llama.cpp's sampler chain on seeded random rows of logits: the oracle of Muser's sampler
// (crates/muser-sample), driven by tests/python/test_sampler_llamacpp.py.
//
// Reads one scenario a line on stdin, `key=value` pairs separated by spaces (every key below is
// required but logit_bias), and prints one line per scenario: the token picked at each step,
// comma-separated. Muser's side is crates/muser-sample/examples/sample_io.rs, which reads the
// same lines, makes the same rows and prints its picks in the same format.
//
// The chain is built from llama.h's samplers as common_sampler_init (common/sampling.cpp) builds
// it: logit_bias (when there are biases), then penalties, top_n_sigma, top_k, typical, top_p,
// min_p, xtc, temp_ext, dist; or, with mirostat 1 or 2, temp and mirostat (m = 100) or
// mirostat_v2. Each pick is accepted into the chain (the penalties' window), as
// common_sampler_accept does.
//
// Rows: row_seed seeds a std::mt19937, and each logit is the sum of 4 draws of
// std::uniform_real_distribution<double>(0, 1), less 2, as a float, times scale; with
// neg_inf > 0 one more draw per logit makes it -inf when the draw is below neg_inf. A row whose
// finite logits are not all distinct, or of which fewer than a quarter are finite, is drawn
// again from the same generator.
//
// Ties: llama.cpp orders equal logits (and typical-p's equal distances) in no specified order,
// where Muser ranks the lower id first, so a tie can change a pick without either being wrong.
// Distinct rows leave the ties that a bias, a penalty or mirostat's temperature make; the
// samplers are applied here one at a time, as llama_sampler_chain_apply does, so the list can be
// looked at between them, and a step is reported as tied when a tie could have decided its pick:
// a tie group of the logits the sorting samplers see (after the penalties; after the temperature
// with mirostat) with the picked token in it, or with some members in the final list (above
// -inf) and others not; the same for typical-p's distances (the group cut in two by typical-p).
// The line then ends with ` tie@S`, S the step (the picks before it are printed), and the test
// compares those steps only.
//
// Build: g++ -O2 -std=c++17 -ffp-contract=off -I$SRC/include -I$SRC/ggml/include
//        llamacpp_sampler.cpp -L$BIN -lllama -Wl,-rpath,$BIN

#include "llama.h"
#include "harness_hex.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

struct Scenario {
    uint32_t row_seed;
    int n_vocab;
    float scale;
    int steps;
    double neg_inf;
    float temperature;
    int top_k;
    float top_p, min_p, typical_p, top_n_sigma, xtc_probability, xtc_threshold;
    float dynatemp_range, dynatemp_exponent;
    int mirostat;
    float mirostat_tau, mirostat_eta;
    int min_keep, repeat_last_n;
    float repeat_penalty, frequency_penalty, presence_penalty;
    uint32_t seed;
    std::vector<llama_logit_bias> logit_bias;
    float dry_multiplier = 0.0f, dry_base = 1.75f;
    int dry_allowed_length = 2, dry_penalty_last_n = 64;
    std::vector<std::string> dry_breakers;
    std::vector<llama_token> prefix;
};

// The vocabulary DRY's breakers are matched against (--vocab MODEL), null without one.
static const llama_vocab * g_vocab = nullptr;


static std::vector<std::string> split(const std::string & s, char sep) {
    std::vector<std::string> out;
    std::istringstream in(s);
    std::string part;
    while (std::getline(in, part, sep)) {
        out.push_back(part);
    }
    return out;
}

static Scenario parse(const std::string & line) {
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
    auto get = [&](const char * key) -> std::string {
        auto it = kv.find(key);
        if (it == kv.end()) {
            throw std::runtime_error(std::string("missing ") + key);
        }
        std::string v = it->second;
        kv.erase(it);
        return v;
    };
    // strtof, not atof: the float nearest the decimal, as Rust's parse::<f32> reads it.
    auto f = [&](const char * key) { return strtof(get(key).c_str(), nullptr); };
    auto i = [&](const char * key) { return (int) strtol(get(key).c_str(), nullptr, 10); };
    auto u = [&](const char * key) { return (uint32_t) strtoul(get(key).c_str(), nullptr, 10); };
    Scenario s;
    s.row_seed = u("row_seed");
    s.n_vocab = i("n_vocab");
    s.scale = f("scale");
    s.steps = i("steps");
    s.neg_inf = strtod(get("neg_inf").c_str(), nullptr);
    s.temperature = f("temperature");
    s.top_k = i("top_k");
    s.top_p = f("top_p");
    s.min_p = f("min_p");
    s.typical_p = f("typical_p");
    s.top_n_sigma = f("top_n_sigma");
    s.xtc_probability = f("xtc_probability");
    s.xtc_threshold = f("xtc_threshold");
    s.dynatemp_range = f("dynatemp_range");
    s.dynatemp_exponent = f("dynatemp_exponent");
    s.mirostat = i("mirostat");
    s.mirostat_tau = f("mirostat_tau");
    s.mirostat_eta = f("mirostat_eta");
    s.min_keep = i("min_keep");
    s.repeat_last_n = i("repeat_last_n");
    s.repeat_penalty = f("repeat_penalty");
    s.frequency_penalty = f("frequency_penalty");
    s.presence_penalty = f("presence_penalty");
    s.seed = u("seed");
    if (kv.count("logit_bias")) {
        // id:bias,id:bias,...
        std::istringstream b(get("logit_bias"));
        std::string pair;
        while (std::getline(b, pair, ',')) {
            size_t colon = pair.find(':');
            if (colon == std::string::npos) {
                throw std::runtime_error("logit_bias entry not id:bias: " + pair);
            }
            s.logit_bias.push_back({ (llama_token) strtol(pair.substr(0, colon).c_str(), nullptr, 10),
                                     strtof(pair.substr(colon + 1).c_str(), nullptr) });
        }
    }
    if (kv.count("dry_multiplier")) {
        s.dry_multiplier = f("dry_multiplier");
        s.dry_base = f("dry_base");
        s.dry_allowed_length = i("dry_allowed_length");
        s.dry_penalty_last_n = i("dry_penalty_last_n");
    }
    if (kv.count("dry_breakers")) {
        for (const auto & h : split(get("dry_breakers"), ',')) {
            s.dry_breakers.push_back(unhex(h));
        }
    }
    if (kv.count("prefix")) {
        for (const auto & t : split(get("prefix"), ',')) {
            s.prefix.push_back((llama_token) strtol(t.c_str(), nullptr, 10));
        }
    }
    if (!kv.empty()) {
        throw std::runtime_error("unknown key " + kv.begin()->first);
    }
    if (s.n_vocab < 1 || s.steps < 0) {
        throw std::runtime_error("n_vocab must be >= 1 and steps >= 0");
    }
    return s;
}

// Whether the finite values are all distinct.
static bool finite_distinct(std::vector<float> v) {
    v.erase(std::remove_if(v.begin(), v.end(), [](float x) { return !std::isfinite(x); }), v.end());
    std::sort(v.begin(), v.end());
    return std::adjacent_find(v.begin(), v.end()) == v.end();
}

static std::vector<float> random_row(std::mt19937 & rng, const Scenario & s) {
    std::uniform_real_distribution<double> u(0.0, 1.0);
    std::vector<float> row(s.n_vocab);
    for (;;) {
        int finite = 0;
        for (float & x : row) {
            double sum = 0.0;
            for (int j = 0; j < 4; ++j) {
                sum += u(rng);
            }
            x = float(sum - 2.0) * s.scale;
            if (s.neg_inf > 0.0 && u(rng) < s.neg_inf) {
                x = -INFINITY;
            }
            finite += std::isfinite(x);
        }
        if (4 * finite >= s.n_vocab && finite_distinct(row)) {
            return row;
        }
    }
}

static llama_sampler * build_chain(const Scenario & s) {
    llama_sampler * c = llama_sampler_chain_init(llama_sampler_chain_default_params());
    auto add = [&](llama_sampler * x) { llama_sampler_chain_add(c, x); };
    if (!s.logit_bias.empty()) {
        add(llama_sampler_init_logit_bias(s.n_vocab, (int32_t) s.logit_bias.size(), s.logit_bias.data()));
    }
    if (s.mirostat == 0) {
        add(llama_sampler_init_penalties(s.n_vocab, s.repeat_last_n, s.repeat_penalty, s.frequency_penalty,
                                         s.presence_penalty));
        // DRY (an empty sampler when off, so the chain's indices stay put).
        std::vector<const char *> breakers;
        for (const auto & b : s.dry_breakers) {
            breakers.push_back(b.c_str());
        }
        if (!breakers.empty() && g_vocab == nullptr) {
            throw std::runtime_error("DRY's breakers need a vocabulary (--vocab MODEL)");
        }
        add(llama_sampler_init_dry(g_vocab, s.dry_multiplier, s.dry_base, s.dry_allowed_length,
                                   s.dry_penalty_last_n, breakers.data(), breakers.size()));
        add(llama_sampler_init_top_n_sigma(s.top_n_sigma));
        add(llama_sampler_init_top_k(s.top_k));
        add(llama_sampler_init_typical(s.typical_p, s.min_keep));
        add(llama_sampler_init_top_p(s.top_p, s.min_keep));
        add(llama_sampler_init_min_p(s.min_p, s.min_keep));
        add(llama_sampler_init_xtc(s.xtc_probability, s.xtc_threshold, s.min_keep, s.seed));
        add(llama_sampler_init_temp_ext(s.temperature, s.dynatemp_range, s.dynatemp_exponent));
        add(llama_sampler_init_dist(s.seed));
    } else if (s.mirostat == 1 || s.mirostat == 2) {
        add(llama_sampler_init_temp(s.temperature));
        add(s.mirostat == 1 ? llama_sampler_init_mirostat(s.n_vocab, s.seed, s.mirostat_tau, s.mirostat_eta, 100)
                            : llama_sampler_init_mirostat_v2(s.seed, s.mirostat_tau, s.mirostat_eta));
    } else {
        throw std::runtime_error("mirostat must be 0, 1 or 2");
    }
    return c;
}

// Typical-p's distance |-ln p - H| of every token of a list, indexed by id (NaN for ids not in
// it), computed as llama_sampler_typical_apply does: the list sorted by logit, p = expf(l - max)
// over their f32 sum, H summed in f32 in that order. `kept` is what typical-p left, with its p:
// they must be the same floats, or this copy of its arithmetic has drifted.
static std::vector<float> typical_distances(std::vector<llama_token_data> list, int n_vocab,
                                            const llama_token_data * kept, size_t n_kept) {
    std::sort(list.begin(), list.end(), [](const llama_token_data & a, const llama_token_data & b) {
        return a.logit > b.logit;
    });
    float sum = 0.0f;
    for (auto & c : list) {
        c.p = expf(c.logit - list[0].logit);
        sum += c.p;
    }
    float entropy = 0.0f;
    for (auto & c : list) {
        c.p /= sum;
        entropy += -c.p * logf(c.p);
    }
    std::vector<float> p(n_vocab, NAN), d(n_vocab, NAN);
    for (const auto & c : list) {
        p[c.id] = c.p;
        d[c.id] = fabsf(-logf(c.p) - entropy);
    }
    for (size_t i = 0; i < n_kept; ++i) {
        if (p[kept[i].id] != kept[i].p) {
            throw std::runtime_error("the copy of typical-p's softmax differs from llama.cpp's");
        }
    }
    return d;
}

// Whether a tie of `value` (by id, NaN = not in the list) could have decided the pick `sel`: a
// group of equal finite values holding `sel` and another member of `in`, or (with `cuts`) one
// with members both in `in` and out of it.
static bool decisive_tie(const std::vector<float> & value, const std::vector<char> & in, int sel, bool cuts) {
    std::vector<int> ids;
    for (int i = 0; i < (int) value.size(); ++i) {
        if (std::isfinite(value[i])) {
            ids.push_back(i);
        }
    }
    std::sort(ids.begin(), ids.end(), [&](int a, int b) { return value[a] < value[b]; });
    for (size_t lo = 0; lo < ids.size();) {
        size_t hi = lo + 1;
        while (hi < ids.size() && value[ids[hi]] == value[ids[lo]]) {
            ++hi;
        }
        if (hi - lo > 1) {
            size_t n_in = 0;
            bool has_sel = false;
            for (size_t k = lo; k < hi; ++k) {
                n_in += in[ids[k]] != 0;
                has_sel |= ids[k] == sel;
            }
            if ((cuts && n_in > 0 && n_in < hi - lo) || (has_sel && n_in > 1)) {
                return true;
            }
        }
        lo = hi;
    }
    return false;
}

// Which tokens a list holds, by id (with finite_only, those above -inf only).
static std::vector<char> members(const llama_token_data_array & cur, int n_vocab, bool finite_only) {
    std::vector<char> in(n_vocab, 0);
    for (size_t i = 0; i < cur.size; ++i) {
        in[cur.data[i].id] = !finite_only || cur.data[i].logit > -INFINITY;
    }
    return in;
}

// The picks of a scenario, and the step at which a tie could have decided the pick (-1: none).
static std::pair<std::vector<llama_token>, int> run(const Scenario & s) {
    llama_sampler * chain = build_chain(s);
    const int n_smpl = llama_sampler_chain_n(chain);
    // The sampler after which the sorting ones see the logits: DRY, after the penalties (after
    // the biases when there are any), or mirostat's temperature (the last but one). Typical-p
    // comes after DRY, top_n_sigma and top_k.
    const int sorted_from = s.mirostat == 0 ? (s.logit_bias.empty() ? 1 : 2) : n_smpl - 2;
    const int typical_at = s.mirostat == 0 && s.typical_p < 1.0f ? sorted_from + 3 : -1;
    std::mt19937 rows(s.row_seed);
    std::vector<llama_token_data> data(s.n_vocab);
    std::vector<llama_token> picks;
    int tie = -1;
    for (llama_token t : s.prefix) {
        llama_sampler_accept(chain, t);
    }
    for (int step = 0; step < s.steps && tie < 0; ++step) {
        std::vector<float> row = random_row(rows, s);
        for (int i = 0; i < s.n_vocab; ++i) {
            data[i] = { i, row[i], 0.0f };
        }
        llama_token_data_array cur = { data.data(), data.size(), -1, false };
        std::vector<float> seen(s.n_vocab, NAN), distance;
        std::vector<llama_token_data> before_typical;
        for (int k = 0; k < n_smpl; ++k) {
            if (k == typical_at) {
                before_typical.assign(cur.data, cur.data + cur.size);
            }
            llama_sampler_apply(llama_sampler_chain_get(chain, k), &cur);
            if (k == sorted_from) {
                for (size_t i = 0; i < cur.size; ++i) {
                    seen[cur.data[i].id] = cur.data[i].logit;
                }
            }
            if (k == typical_at) {
                distance = typical_distances(before_typical, s.n_vocab, cur.data, cur.size);
                // A tie group that typical-p's cut splits.
                if (decisive_tie(distance, members(cur, s.n_vocab, false), -1, true)) {
                    tie = step;
                }
            }
        }
        if (cur.selected < 0 || cur.selected >= (int64_t) cur.size) {
            throw std::runtime_error("llama.cpp selected no token at step " + std::to_string(step));
        }
        const llama_token t = cur.data[cur.selected].id;
        const std::vector<char> in_final = members(cur, s.n_vocab, true);
        if (decisive_tie(seen, in_final, t, true) ||
            (!distance.empty() && decisive_tie(distance, in_final, t, false))) {
            tie = step;
        }
        if (tie < 0) {
            picks.push_back(t);
            llama_sampler_accept(chain, t);
        }
    }
    llama_sampler_free(chain);
    return { picks, tie };
}

// --vocab MODEL loads MODEL's vocabulary for DRY; --pieces then prints `piece HEX` for each
// token (its text as DRY sees it), --tokenize reads hex texts on stdin and prints `tokenize HEX
// IDS` for each (its tokenization as DRY's breakers get it).
int main(int argc, char ** argv) {
    std::string mode;
    for (int a = 1; a < argc; ++a) {
        std::string arg = argv[a];
        if (arg == "--vocab" && a + 1 < argc) {
            llama_model_params mp = llama_model_default_params();
            mp.vocab_only = true;
            llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
            llama_model * model = llama_model_load_from_file(argv[++a], mp);
            if (model == nullptr) {
                fprintf(stderr, "llamacpp_sampler: cannot load the vocabulary of %s\n", argv[a]);
                return 1;
            }
            g_vocab = llama_model_get_vocab(model);
        } else if (arg == "--pieces" || arg == "--tokenize") {
            mode = arg;
        } else {
            fprintf(stderr, "usage: llamacpp_sampler [--vocab MODEL [--pieces | --tokenize]]\n");
            return 2;
        }
    }
    if (mode == "--pieces") {
        for (llama_token t = 0; t < llama_vocab_n_tokens(g_vocab); ++t) {
            std::string text(256, '\0');
            int n = llama_detokenize(g_vocab, &t, 1, &text[0], (int32_t) text.size(), false, true);
            if (n < 0) {
                text.resize(-n);
                n = llama_detokenize(g_vocab, &t, 1, &text[0], (int32_t) text.size(), false, true);
            }
            text.resize(n);
            std::cout << "piece " << hex(text) << "\n";
        }
        return 0;
    }
    if (mode == "--tokenize") {
        std::string h;
        while (std::getline(std::cin, h)) {
            std::string text = unhex(h);
            std::vector<llama_token> toks(text.size() + 8);
            int n = llama_tokenize(g_vocab, text.data(), (int32_t) text.size(), toks.data(),
                                   (int32_t) toks.size(), false, false);
            std::string out;
            for (int k = 0; k < n; ++k) {
                out += (k ? "," : "") + std::to_string(toks[k]);
            }
            std::cout << "tokenize " << h << " " << out << "\n";
        }
        return 0;
    }
    std::string line;
    int lineno = 0;
    while (std::getline(std::cin, line)) {
        ++lineno;
        try {
            auto [picks, tie] = run(parse(line));
            std::string out;
            for (size_t i = 0; i < picks.size(); ++i) {
                out += (i ? "," : "") + std::to_string(picks[i]);
            }
            if (tie >= 0) {
                out += " tie@" + std::to_string(tie);
            }
            std::cout << out << "\n";
        } catch (const std::exception & e) {
            fprintf(stderr, "llamacpp_sampler: line %d: %s\n", lineno, e.what());
            return 1;
        }
    }
    return 0;
}
