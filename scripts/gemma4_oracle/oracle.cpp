// Oracle: llama.cpp's own chat parsing of raw outputs (reads JSON lines, writes JSON lines).
#include "chat.h"
#include <nlohmann/json.hpp>
#include <fstream>
#include <iostream>
#include <sstream>
using json = nlohmann::ordered_json;
int main(int argc, char ** argv) {
    std::ifstream f(argv[1]);
    std::stringstream ss; ss << f.rdbuf();
    auto tmpls = common_chat_templates_init(nullptr, ss.str(), "<bos>", "<eos>");
    std::string line;
    while (std::getline(std::cin, line)) {
        auto in = json::parse(line);
        common_chat_templates_inputs inputs;
        common_chat_msg user; user.role = "user"; user.content = "hi";
        inputs.messages.push_back(user);
        for (auto & t : in.value("tools", json::array())) {
            common_chat_tool tool;
            tool.name = t["function"]["name"];
            tool.description = t["function"].value("description", "");
            tool.parameters = t["function"].contains("parameters") ? t["function"]["parameters"].dump() : "{}";
            inputs.tools.push_back(tool);
        }
        std::string choice = in.value("tool_choice", "auto");
        inputs.tool_choice = choice == "required" ? COMMON_CHAT_TOOL_CHOICE_REQUIRED : choice == "none" ? COMMON_CHAT_TOOL_CHOICE_NONE : COMMON_CHAT_TOOL_CHOICE_AUTO;
        inputs.parallel_tool_calls = in.value("parallel", false);
        inputs.enable_thinking = in.value("enable_thinking", true);
        inputs.reasoning_format = COMMON_REASONING_FORMAT_DEEPSEEK;
        json out;
        try {
            auto params = common_chat_templates_apply(tmpls.get(), inputs);
            common_chat_parser_params pp(params);
            pp.reasoning_format = COMMON_REASONING_FORMAT_DEEPSEEK;
            if (!params.parser.empty()) pp.parser.load(params.parser);
            auto msg = common_chat_parse(in["text"].get<std::string>(), in.value("partial", false), pp);
            out["content"] = msg.content;
            out["reasoning_content"] = msg.reasoning_content;
            json calls = json::array();
            for (auto & c : msg.tool_calls) calls.push_back({{"name", c.name}, {"arguments", c.arguments}});
            out["tool_calls"] = calls;
            out["generation_prompt"] = params.generation_prompt;
        } catch (const std::exception & e) {
            out["error"] = e.what();
        }
        std::cout << out.dump() << std::endl;
    }
}
