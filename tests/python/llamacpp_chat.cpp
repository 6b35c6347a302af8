// llama.cpp's reading of a chat answer, the oracle of test_chat_reading.py: one JSON request per
// line on stdin, {"template": PATH, "messages": [...], "tools": [...], "tool_choice": ...,
// "parallel_tool_calls": BOOL, "enable_thinking": BOOL (default true), "chat_template_kwargs":
// {...} (optional), "text": RAW OUTPUT}; one JSON line per request on stdout, the
// message llama-server would answer ({"content", "reasoning_content", "tool_calls": [{"name",
// "arguments"}]}) or {"error": WHAT}. The chat parameters are made as llama-server makes them for
// a chat request (its default reasoning format, thinking on unless the request turns it off),
// from the template file alone.
//
// Built by the test against llama.cpp's common library (libllama-common); only its public chat
// API is called.

#include "chat.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>

using json = nlohmann::ordered_json;

static std::string read_file(const std::string & path) {
    std::ifstream f(path);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
}

static json answer(const json & req, std::map<std::string, common_chat_templates_ptr> & cache) {
    const std::string path = req.at("template");
    auto it = cache.find(path);
    if (it == cache.end()) {
        it = cache.emplace(path, common_chat_templates_init(nullptr, read_file(path))).first;
    }
    common_chat_templates_inputs in;
    in.messages = common_chat_msgs_parse_oaicompat(common_json::parse(req.at("messages").dump()));
    const json tools = req.value("tools", json::array());
    in.tools = common_chat_tools_parse_oaicompat(common_json::parse(tools.dump()));
    // As llama-server: a tool_choice that is not a string (a named function) is "auto".
    const json choice = req.value("tool_choice", json("auto"));
    in.tool_choice = common_chat_tool_choice_parse_oaicompat(choice.is_string() ? choice.get<std::string>() : "auto");
    in.parallel_tool_calls = req.value("parallel_tool_calls", false);
    in.use_jinja = true;
    in.add_generation_prompt = true;
    in.reasoning_format = COMMON_REASONING_FORMAT_DEEPSEEK;
    in.enable_thinking = req.value("enable_thinking", true);
    // As llama-server: each of the request's template variables as its JSON text.
    const json kwargs = req.value("chat_template_kwargs", json::object());
    for (const auto & [k, v] : kwargs.items()) {
        in.chat_template_kwargs[k] = v.dump();
    }
    const common_chat_params params = common_chat_templates_apply(it->second.get(), in);

    common_chat_parser_params pp(params);
    pp.reasoning_format = COMMON_REASONING_FORMAT_DEEPSEEK;
    pp.parse_tool_calls = !in.tools.empty() && in.tool_choice != COMMON_CHAT_TOOL_CHOICE_NONE;
    if (!params.parser.empty()) {
        pp.parser.load(params.parser);
    }
    const common_chat_msg msg = common_chat_parse(req.at("text").get<std::string>(), false, pp);
    json calls = json::array();
    for (const auto & c : msg.tool_calls) {
        calls.push_back({{"name", c.name}, {"arguments", c.arguments}});
    }
    return {{"content", msg.content}, {"reasoning_content", msg.reasoning_content}, {"tool_calls", calls}};
}

int main() {
    std::map<std::string, common_chat_templates_ptr> cache;
    std::string line;
    while (std::getline(std::cin, line)) {
        json out;
        try {
            out = answer(json::parse(line), cache);
        } catch (const std::exception & e) {
            out = {{"error", e.what()}};
        }
        std::cout << out.dump() << std::endl;
    }
    return 0;
}
