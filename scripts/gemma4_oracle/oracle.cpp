// llama.cpp's own reading of Gemma 4 outputs, for Muser's tests (gen_fixture.py feeds it): for
// each JSON line on stdin ({"text", "tools", "tool_choice", "parallel", "enable_thinking"}) the
// chat parameters llama-server makes for the template (argv[1]) and common_chat_parse's reading
// of the text, as a JSON line. Build against llama.cpp's source and libraries:
//   S=$MUSER_GGML_SRC; g++ -O1 -std=c++17 -I$S/common -I$S/include -I$S/ggml/include -I$S/vendor \
//     oracle.cpp -L$LLAMA_CPP_BIN -lllama-common -lllama -lggml -lggml-base \
//     -Wl,-rpath,$LLAMA_CPP_BIN -o gemma4_oracle
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
