//! Tool calls on the local model.
//!
//! A request that offers tools is served locally by holding generation to
//! a grammar: calls in the Hermes format tool-trained small models know
//! (`<tool_call>{"name": …, "arguments": {…}}</tool_call>`, the arguments
//! held to the tool's JSON schema by llama.cpp's own converter; one call,
//! or up to [`MAX_CALLS`] when the request says `parallel_tool_calls:
//! true`) or, when `tool_choice` is `auto`, plain text. The calls come back as
//! OpenAI's `tool_calls`. Earlier calls and their results in the conversation are
//! rendered in the same format, so the model sees what it called.
//!
//! What the grammar cannot express (a tool type other than `function`, a
//! schema llama.cpp cannot convert, tools together with a
//! `response_format`) is left to an upstream.

use crate::{Invalid, SchemaGrammar};
use serde_json::{Map, Value, json};
use std::sync::Arc;

const CALL_OPEN: &str = "<tool_call>";
const CALL_CLOSE: &str = "</tool_call>";
/// Calls one local answer may hold: a bound on what a small model that
/// keeps repeating itself can spend of `max_tokens` on calls.
pub const MAX_CALLS: usize = 8;

/// Which requests offering tools the local model serves (`[local]
/// tool_calls`). A small local model's tool calls are well-formed (a
/// grammar holds them to the tool's schema) but often worse chosen than an
/// upstream's, so by default only requests that may not leave the node
/// get them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LocalToolCalls {
    /// Only requests that may not leave; the others go to an upstream.
    #[default]
    Kept,
    /// Every request the policy places on the local model.
    Always,
    /// None: a request offering tools needs an upstream (or gets a 400
    /// when it may not leave).
    Never,
}

impl LocalToolCalls {
    /// Why the local model does not serve the tool calls of a request that
    /// may (or may not) leave the node, or None when it does. The node and
    /// the Spin gateway place such a request as after any local refusal.
    pub fn refusal(self, may_leave: bool) -> Option<&'static str> {
        match self {
            Self::Kept if may_leave => {
                Some("tool calls for a request that may leave ([local] tool_calls = \"kept\")")
            }
            Self::Never => Some("tool calls ([local] tool_calls = \"never\")"),
            _ => None,
        }
    }
}

/// The tools a request offers the local model, validated.
#[derive(Debug, Clone)]
pub struct Offered {
    /// Each tool's `function` object (name, description, parameters).
    functions: Vec<Map<String, Value>>,
    /// `tool_choice` is `required` or names a function: text is not an answer.
    must_call: bool,
    /// `parallel_tool_calls: true`: more than one call in an answer. Only
    /// when asked, though OpenAI's default is true: a small model allowed a
    /// second call tends to repeat its first until `max_tokens` (SmolLM2
    /// does, greedy), so one call is the local default.
    parallel: bool,
}

/// What the local model makes of a request's `tools`.
#[derive(Debug, Clone)]
pub enum Offer {
    /// No tools, or `tool_choice` is `none`.
    None,
    Local(Offered),
    /// Tools the grammar cannot serve: only an upstream can.
    UpstreamOnly(&'static str),
}

/// Read `tools` and `tool_choice`. Malformed ones are the client's error
/// (400) wherever the request would have run.
pub fn offer(request: &Map<String, Value>) -> Result<Offer, Invalid> {
    let invalid = |why: String| Invalid::request(why).param("tools");
    let tools = match request.get("tools") {
        None | Some(Value::Null) => return Ok(Offer::None),
        Some(Value::Array(tools)) if tools.is_empty() => return Ok(Offer::None),
        Some(Value::Array(tools)) => tools,
        Some(_) => return Err(invalid("'tools' must be an array of tools".into())),
    };
    let mut functions = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        match tool.get("type").and_then(Value::as_str) {
            Some("function") => {}
            Some(_) => return Ok(Offer::UpstreamOnly("tools of a type other than 'function'")),
            None => return Err(invalid(format!("tools[{i}].type is missing"))),
        }
        let Some(function) = tool.get("function").and_then(Value::as_object) else {
            return Err(invalid(format!("tools[{i}].function must be an object")));
        };
        match function.get("name").and_then(Value::as_str) {
            Some(name) if !name.is_empty() => {}
            _ => return Err(invalid(format!("tools[{i}].function.name is missing"))),
        }
        if function
            .get("parameters")
            .is_some_and(|p| !p.is_object() && !p.is_null())
        {
            return Err(invalid(format!(
                "tools[{i}].function.parameters must be a JSON schema object"
            )));
        }
        functions.push(function.clone());
    }
    let name_of = |f: &Map<String, Value>| f["name"].as_str().unwrap_or_default().to_string();
    let must_call = match request.get("tool_choice") {
        None | Some(Value::Null) => false,
        Some(Value::String(choice)) => match choice.as_str() {
            "none" => return Ok(Offer::None),
            "auto" => false,
            "required" => true,
            other => {
                return Err(Invalid::request(format!(
                    "'tool_choice' must be 'none', 'auto', 'required' or a function, not '{other}'"
                ))
                .param("tool_choice"));
            }
        },
        Some(choice) => {
            let named = choice
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    Invalid::request("'tool_choice' names no function").param("tool_choice")
                })?;
            if !functions.iter().any(|f| name_of(f) == named) {
                return Err(Invalid::request(format!(
                    "'tool_choice' names '{named}', which is not among the tools"
                ))
                .param("tool_choice"));
            }
            functions.retain(|f| name_of(f) == named);
            true
        }
    };
    let parallel = match request.get("parallel_tool_calls") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(parallel)) => *parallel,
        Some(_) => {
            return Err(
                Invalid::request("'parallel_tool_calls' must be true or false")
                    .param("parallel_tool_calls"),
            );
        }
    };
    if request
        .get("response_format")
        .and_then(|f| f.get("type"))
        .and_then(Value::as_str)
        .is_some_and(|t| t != "text")
    {
        return Ok(Offer::UpstreamOnly("tools together with a response_format"));
    }
    Ok(Offer::Local(Offered {
        functions,
        must_call,
        parallel,
    }))
}

impl Offered {
    /// The GBNF grammar the local model generates under, or why there is
    /// none (a parameters schema `to_grammar` cannot convert).
    pub fn grammar(&self, to_grammar: &SchemaGrammar) -> Result<Arc<str>, String> {
        // One object schema per function, written by hand so `name` comes
        // before `arguments` (llama.cpp keeps the order it is given; a
        // serde_json map would sort them).
        let alternatives: Vec<String> = self
            .functions
            .iter()
            .map(|f| {
                // No `parameters` is OpenAI's function without arguments.
                let parameters = match f.get("parameters") {
                    Some(p) if p.is_object() => p.to_string(),
                    _ => r#"{"type":"object","properties":{},"additionalProperties":false}"#
                        .to_string(),
                };
                format!(
                    r#"{{"type":"object","properties":{{"name":{{"const":{}}},"arguments":{parameters}}},"required":["name","arguments"],"additionalProperties":false}}"#,
                    f["name"]
                )
            })
            .collect();
        let schema = format!(r#"{{"oneOf":[{}]}}"#, alternatives.join(","));
        let call = to_grammar(&schema)?;
        let call = rename_rule(&call, "root", "edgeroute-call");
        let wrapped = r#""<tool_call>\n" edgeroute-call "\n</tool_call>""#;
        let calls = if self.parallel {
            let more = MAX_CALLS - 1;
            format!("edgeroute-calls ::= {wrapped} (\"\\n\" {wrapped}){{0,{more}}}\n")
        } else {
            format!("edgeroute-calls ::= {wrapped}\n")
        };
        let root = if self.must_call {
            "root ::= edgeroute-calls\n".to_string()
        } else {
            // Text may be anything that does not begin a call.
            "root ::= edgeroute-calls | edgeroute-text\nedgeroute-text ::= [^<] .*\n".to_string()
        };
        Ok(Arc::from(format!("{root}{calls}{call}")))
    }

    /// The system prompt's section that describes the tools, in the words
    /// of the format's usual template.
    pub fn prompt(&self) -> String {
        let tools: Vec<String> = self
            .functions
            .iter()
            .map(|f| json!({ "type": "function", "function": f }).to_string())
            .collect();
        let how_many = if self.parallel { "one or more" } else { "one" };
        format!(
            "# Tools\n\nYou may call {how_many} of these functions to assist with the user query.\n\n\
             You are provided with function signatures within <tools></tools> XML tags:\n\
             <tools>\n{}\n</tools>\n\n\
             For a function call, return a json object with the function name and arguments \
             within <tool_call></tool_call> XML tags:\n\
             <tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call>",
            tools.join("\n")
        )
    }
}

/// Add the tools' description to the conversation: appended to its first
/// system message, or as a new first one. Returns where the node's text
/// begins in the first message (0: the whole message is the node's).
pub fn describe(messages: &mut Vec<(String, String)>, offered: &Offered) -> usize {
    let section = offered.prompt();
    match messages.first_mut() {
        Some((role, text)) if role == "system" => {
            let client = text.len();
            text.push_str("\n\n");
            text.push_str(&section);
            client
        }
        _ => {
            messages.insert(0, ("system".to_string(), section));
            0
        }
    }
}

/// A message of the conversation as the local model reads it: an
/// assistant's earlier tool calls follow its text in the call format, a
/// tool's result is the user's turn inside `<tool_response>` tags.
pub fn render(role: &str, text: String, message: &Value) -> (String, String) {
    if role == "tool" {
        return (
            "user".to_string(),
            format!("<tool_response>\n{text}\n</tool_response>"),
        );
    }
    let calls = message.get("tool_calls").and_then(Value::as_array);
    let Some(calls) = calls.filter(|c| !c.is_empty()) else {
        return (role.to_string(), text);
    };
    let mut text = text;
    for call in calls {
        let function = call.get("function");
        let name = function.and_then(|f| f.get("name")).cloned();
        // OpenAI sends arguments as a JSON string; the model wrote an object.
        let arguments = match function.and_then(|f| f.get("arguments")) {
            Some(Value::String(s)) => serde_json::from_str(s).unwrap_or(Value::String(s.clone())),
            Some(other) => other.clone(),
            None => json!({}),
        };
        if !text.is_empty() {
            text.push('\n');
        }
        // By hand, name first, as the grammar has the model write it.
        text.push_str(&format!(
            "{CALL_OPEN}\n{{\"name\": {}, \"arguments\": {arguments}}}\n{CALL_CLOSE}",
            name.unwrap_or(Value::Null)
        ));
    }
    (role.to_string(), text)
}

/// The assistant message for a local answer that is tool calls, or None
/// when it is text. An answer cut short by `max_tokens` inside its first
/// call stays text; one cut inside a later call keeps the whole calls
/// before it (what a model that repeats itself leaves). The first call's
/// id is `call_id`, the next ones `call_id` and their position
/// (`call_x_1`, …).
pub fn call_message(text: &str, call_id: &str) -> Option<Value> {
    let mut rest = text.trim();
    let mut calls = Vec::new();
    while !rest.is_empty() {
        let opened = rest.strip_prefix(CALL_OPEN)?;
        let Some((body, after)) = opened.split_once(CALL_CLOSE) else {
            // Cut short: the calls before it stand, if there are any.
            break;
        };
        let call: Value = serde_json::from_str(body.trim()).ok()?;
        let name = call.get("name")?.as_str()?;
        let arguments = call.get("arguments")?;
        let id = match calls.len() {
            0 => call_id.to_string(),
            n => format!("{call_id}_{n}"),
        };
        calls.push(json!({
            "id": id,
            "type": "function",
            "function": { "name": name, "arguments": arguments.to_string() },
        }));
        rest = after.trim_start();
    }
    (!calls.is_empty()).then(|| {
        json!({
            "role": "assistant",
            "content": null,
            "tool_calls": calls,
        })
    })
}

/// A finished message's tool calls as one streamed delta: each call whole,
/// with the `index` streamed calls carry. None when it has no calls.
pub fn streamed_calls(message: &Value) -> Option<Value> {
    let calls = message.get("tool_calls")?.as_array()?;
    let calls: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(index, call)| {
            let mut call = call.clone();
            if let Some(fields) = call.as_object_mut() {
                fields.insert("index".into(), index.into());
            }
            call
        })
        .collect();
    Some(json!({ "tool_calls": calls }))
}

/// Rename a GBNF rule wherever it is defined or used, leaving quoted
/// literals, character classes and comments alone (a property called
/// `root` is a literal, not the rule).
fn rename_rule(grammar: &str, from: &str, to: &str) -> String {
    let mut out = String::with_capacity(grammar.len() + 32);
    let mut chars = grammar.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' | '[' => {
                let close = if c == '"' { '"' } else { ']' };
                out.push(c);
                while let Some(d) = chars.next() {
                    out.push(d);
                    if d == '\\' {
                        if let Some(escaped) = chars.next() {
                            out.push(escaped);
                        }
                    } else if d == close {
                        break;
                    }
                }
            }
            '#' => {
                out.push(c);
                for d in chars.by_ref() {
                    out.push(d);
                    if d == '\n' {
                        break;
                    }
                }
            }
            c if c.is_ascii_alphanumeric() || c == '-' || c == '_' => {
                let mut word = String::from(c);
                while let Some(&d) = chars.peek() {
                    if d.is_ascii_alphanumeric() || d == '-' || d == '_' {
                        word.push(d);
                        chars.next();
                    } else {
                        break;
                    }
                }
                out.push_str(if word == from { to } else { &word });
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(body: Value) -> Map<String, Value> {
        body.as_object().unwrap().clone()
    }

    fn weather(choice: Option<Value>) -> Map<String, Value> {
        let mut body = json!({
            "tools": [
                {"type": "function", "function": {"name": "get_weather",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                "required": ["city"]}}},
                {"type": "function", "function": {"name": "get_time"}},
            ]
        });
        if let Some(choice) = choice {
            body["tool_choice"] = choice;
        }
        request(body)
    }

    fn offered(body: Map<String, Value>) -> Offered {
        match offer(&body).unwrap() {
            Offer::Local(offered) => offered,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_choice_decides_whether_text_is_allowed_and_which_tools() {
        assert!(!offered(weather(None)).must_call);
        assert!(offered(weather(Some(json!("required")))).must_call);
        let named = offered(weather(Some(
            json!({"type": "function", "function": {"name": "get_time"}}),
        )));
        assert!(named.must_call);
        assert_eq!(named.functions.len(), 1);
        assert_eq!(named.functions[0]["name"], "get_time");
        assert!(matches!(
            offer(&weather(Some(json!("none")))).unwrap(),
            Offer::None
        ));
    }

    #[test]
    fn the_mode_says_which_requests_keep_their_tool_calls_local() {
        use LocalToolCalls::*;
        assert_eq!(LocalToolCalls::default(), Kept);
        assert!(Kept.refusal(true).unwrap().contains("may leave"));
        assert_eq!(Kept.refusal(false), None);
        assert_eq!((Always.refusal(true), Always.refusal(false)), (None, None));
        assert!(Never.refusal(false).unwrap().contains("never"));
    }

    #[test]
    fn malformed_tools_are_the_clients_error() {
        for (body, needle) in [
            (json!({"tools": {"name": "x"}}), "must be an array"),
            (
                json!({"tools": [{"function": {"name": "x"}}]}),
                "type is missing",
            ),
            (
                json!({"tools": [{"type": "function"}]}),
                "must be an object",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "x", "parameters": 3}}]}),
                "JSON schema object",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "x"}}], "tool_choice": "maybe"}),
                "'maybe'",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "x"}}],
                       "tool_choice": {"type": "function", "function": {"name": "y"}}}),
                "'y'",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "x"}}],
                       "parallel_tool_calls": "yes"}),
                "'parallel_tool_calls' must be true or false",
            ),
        ] {
            let error = offer(&request(body.clone())).unwrap_err();
            assert!(error.message.contains(needle), "{body}: {error:?}");
        }
        assert!(matches!(
            offer(&request(
                json!({"tools": [{"type": "custom", "custom": {}}]})
            ))
            .unwrap(),
            Offer::UpstreamOnly(_)
        ));
    }

    /// Stands in for llama.cpp's converter: the schema as one literal.
    fn literal(schema: &str) -> Result<String, String> {
        Ok(format!("root ::= root-kv\nroot-kv ::= {schema:?}\n"))
    }

    #[test]
    fn the_grammar_wraps_the_converted_schema_and_allows_text_only_on_auto() {
        let mut parallel = weather(None);
        parallel.insert("parallel_tool_calls".into(), json!(true));
        let parallel = offered(parallel);
        let auto = parallel.grammar(&literal).unwrap();
        assert!(auto.starts_with("root ::= edgeroute-calls | edgeroute-text\n"));
        // Asked for parallel calls: up to MAX_CALLS, a newline between two.
        let wrapped = r#""<tool_call>\n" edgeroute-call "\n</tool_call>""#;
        assert!(
            auto.contains(&format!(
                "\nedgeroute-calls ::= {wrapped} (\"\\n\" {wrapped}){{0,7}}\n"
            )),
            "{auto}"
        );
        // The converter's own root is renamed, so the grammar has one root.
        assert!(auto.contains("\nedgeroute-call ::= root-kv\n"), "{auto}");
        assert_eq!(auto.matches("root ::=").count(), 1, "{auto}");
        // Each function's schema, name first, the arguments its parameters.
        let schema = auto.split("root-kv ::= ").nth(1).unwrap();
        let first = schema.find("get_weather").unwrap();
        assert!(first < schema.find("city").unwrap());
        assert!(schema.contains("get_time"));
        let required = offered(weather(Some(json!("required"))))
            .grammar(&literal)
            .unwrap();
        assert!(!required.contains("edgeroute-text"));
        // Without `parallel_tool_calls: true`: exactly one call, and the
        // prompt asks for one.
        for parallel in [None, Some(false)] {
            let mut single = weather(Some(json!("required")));
            if let Some(parallel) = parallel {
                single.insert("parallel_tool_calls".into(), json!(parallel));
            }
            let single = offered(single);
            let grammar = single.grammar(&literal).unwrap();
            assert!(
                grammar.contains(&format!("\nedgeroute-calls ::= {wrapped}\n")),
                "{grammar}"
            );
            assert!(single.prompt().contains("You may call one of these"));
        }
        assert!(
            parallel
                .prompt()
                .contains("You may call one or more of these")
        );
        assert!(
            offered(weather(None))
                .grammar(&|_| Err("no".into()))
                .is_err()
        );
    }

    #[test]
    fn renaming_leaves_literals_and_classes_alone() {
        let grammar = "root ::= \"root\" [root] root-kv | root # root\nroot-kv ::= root\n";
        assert_eq!(
            rename_rule(grammar, "root", "call"),
            "call ::= \"root\" [root] root-kv | call # root\nroot-kv ::= call\n"
        );
    }

    #[test]
    fn a_call_becomes_openai_tool_calls_and_a_cut_call_stays_text() {
        let message = call_message(
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
            "call_1",
        )
        .unwrap();
        let call = &message["tool_calls"][0];
        assert_eq!(call["id"], "call_1");
        assert_eq!(call["function"]["name"], "get_weather");
        let arguments: Value =
            serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(arguments["city"], "Paris");
        assert!(message["content"].is_null());
        assert!(call_message("<tool_call>\n{\"name\": \"get_wea", "c").is_none());
        assert!(call_message("It is sunny.", "c").is_none());
    }

    #[test]
    fn several_calls_keep_their_order_and_get_their_own_ids() {
        let call = |city: &str| {
            format!(
                "<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {{\"city\": \"{city}\"}}}}\n</tool_call>"
            )
        };
        let text = format!("{}\n{}\n{}", call("Paris"), call("Lyon"), call("Nice"));
        let message = call_message(&text, "call_x").unwrap();
        let calls = message["tool_calls"].as_array().unwrap();
        let ids: Vec<&str> = calls.iter().map(|c| c["id"].as_str().unwrap()).collect();
        assert_eq!(ids, ["call_x", "call_x_1", "call_x_2"]);
        let cities: Vec<String> = calls
            .iter()
            .map(|c| {
                let arguments = c["function"]["arguments"].as_str().unwrap();
                serde_json::from_str::<Value>(arguments).unwrap()["city"].to_string()
            })
            .collect();
        assert_eq!(cities, ["\"Paris\"", "\"Lyon\"", "\"Nice\""]);
        // Streamed, each carries its index.
        let delta = streamed_calls(&message).unwrap();
        assert_eq!(delta["tool_calls"][2]["index"], 2);
        // A second call cut short: the first stands.
        let cut = format!("{}\n<tool_call>\n{{\"name\": \"get_we", call("Paris"));
        let message = call_message(&cut, "c").unwrap();
        assert_eq!(message["tool_calls"].as_array().unwrap().len(), 1);
        // Text after a call is not a call.
        assert!(call_message(&format!("{} and more", call("Paris")), "c").is_none());
    }

    #[test]
    fn earlier_calls_and_results_are_rendered_for_the_model() {
        let assistant = json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}]});
        let (role, text) = render("assistant", String::new(), &assistant);
        assert_eq!(role, "assistant");
        assert_eq!(
            text,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Oslo\"}}\n</tool_call>"
        );
        let (role, text) = render("tool", "4 degrees".into(), &json!({}));
        assert_eq!(
            (role.as_str(), text.as_str()),
            ("user", "<tool_response>\n4 degrees\n</tool_response>")
        );
        let mut messages = vec![("user".to_string(), "hi".to_string())];
        assert_eq!(describe(&mut messages, &offered(weather(None))), 0);
        assert_eq!(messages[0].0, "system");
        assert!(messages[0].1.contains("\"name\":\"get_weather\""));
        // Appended to the client's system message: the client's text ends
        // where the node's begins.
        let mut messages = vec![("system".to_string(), "be brief".to_string())];
        let at = describe(&mut messages, &offered(weather(None)));
        assert_eq!(&messages[0].1[..at], "be brief");
        assert!(messages[0].1[at..].contains("<tools>"));
        let texts: Vec<&str> = crate::client_texts(&messages, Some(at)).collect();
        assert_eq!(texts, ["be brief"]);
    }
}
