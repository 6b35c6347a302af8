//! Lists a template can change, as jinja2's (Python's) and llama-server's are: Kimi K2's
//! template queues its tool calls' ids with `ids.append(id)` and takes them back with
//! `ids.pop(0)`, where minijinja's own lists are fixed ("sequence has no method named
//! append").
//!
//! `compile` (chat.rs) makes each list the template writes (`[]`, `[a, b]`) one of these,
//! fresh each time the expression runs, as Python makes a new list for each evaluation of a
//! literal: a constant list by a call of its own function (`constant`), any other by a call
//! of `BUILD`. Lists the template reads (messages, tools) stay minijinja's.

use minijinja::value::{from_args, Enumerator, Object, ObjectRepr, Value};
use minijinja::{Error, ErrorKind, State};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// The function a list literal of non-constant items calls with its items: a name no
/// template can write, so that none reads or replaces it.
pub const BUILD: &str = "[]";

/// Whether `name` is one of the functions `compile` makes the template call (`BUILD`,
/// `constant`), which a request's variables must not replace.
pub fn is_internal(name: &str) -> bool {
    name.starts_with('[')
}

/// The name of the function that makes the `k`th constant list of a template afresh:
/// `[k]`, which no template can write. The names are made once for the whole process
/// (each template's `k`th constant list has the same name in its own environment), so there
/// are as many as the template with the most constant lists has.
pub fn constant(k: usize) -> &'static str {
    static NAMES: OnceLock<Mutex<Vec<&'static str>>> = OnceLock::new();
    let mut names = NAMES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    while names.len() <= k {
        let name = format!("[{}]", names.len());
        names.push(Box::leak(name.into_boxed_str()));
    }
    names[k]
}

/// A list the template can change. It reads as minijinja's own lists do (items, length,
/// iteration, slices, `in`, equality, `tojson`, printing); its methods are Python's.
#[derive(Debug, Default)]
pub struct List(Mutex<Vec<Value>>);

impl List {
    /// A new list of `items`, as a template value.
    pub fn value(items: Vec<Value>) -> Value {
        Value::from_object(List(Mutex::new(items)))
    }

    fn items(&self) -> MutexGuard<'_, Vec<Value>> {
        // A panic elsewhere leaves the items as they were: take them.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The items, copied: what compares them must not hold the lock, as comparing with a
    /// list that holds this one reads it again.
    fn snapshot(&self) -> Vec<Value> {
        self.items().clone()
    }

    /// Whether `value` is this list or holds it through lists (`a.append(a)`): such a list
    /// would print, and compare, without end.
    fn reaches(self: &Arc<Self>, value: &Value) -> bool {
        let Some(list) = value.downcast_object_ref::<List>() else {
            return false;
        };
        if std::ptr::eq(list, &**self) {
            return true;
        }
        list.snapshot().iter().any(|v| self.reaches(v))
    }

    /// `value`, or an error where it would hold this list in itself.
    fn addable(self: &Arc<Self>, method: &str, value: Value) -> Result<Value, Error> {
        if self.reaches(&value) {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("list.{method}: a list cannot hold itself"),
            ));
        }
        Ok(value)
    }
}

/// Python's index `i` into a list of `len` items (negative from the end), where in range.
fn position(i: i64, len: usize) -> Option<usize> {
    let i = if i < 0 {
        i.checked_add(i64::try_from(len).ok()?)?
    } else {
        i
    };
    usize::try_from(i).ok().filter(|&i| i < len)
}

/// Python's slice bound `i` of a list of `len` items: negative from the end, clamped to it.
fn bound(i: i64, len: usize) -> usize {
    let len_i = i64::try_from(len).unwrap_or(i64::MAX);
    let i = if i < 0 { i.saturating_add(len_i) } else { i };
    i.clamp(0, len_i) as usize
}

impl Object for List {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Seq
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.items().get(key.as_usize()?).cloned()
    }

    /// The items as they are when the iteration starts (a loop that changes the list goes on
    /// over the items it began with).
    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Values(self.snapshot())
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        Some(self.items().len())
    }

    fn call_method(
        self: &Arc<Self>,
        _state: &State<'_, '_>,
        method: &str,
        args: &[Value],
    ) -> Result<Value, Error> {
        let error = |msg: &str| Error::new(ErrorKind::InvalidOperation, format!("list.{msg}"));
        let none = Value::from(());
        match method {
            "append" => {
                let (item,): (Value,) = from_args(args)?;
                let item = self.addable(method, item)?;
                self.items().push(item);
                Ok(none)
            }
            "extend" => {
                let (more,): (Value,) = from_args(args)?;
                // (taken before the list is locked: `a.extend(a)` reads the list it extends)
                let more = more
                    .try_iter()?
                    .map(|v| self.addable(method, v))
                    .collect::<Result<Vec<_>, _>>()?;
                self.items().extend(more);
                Ok(none)
            }
            "insert" => {
                let (at, item): (i64, Value) = from_args(args)?;
                let item = self.addable(method, item)?;
                let mut items = self.items();
                let at = bound(at, items.len());
                items.insert(at, item);
                Ok(none)
            }
            "pop" => {
                let (at,): (Option<i64>,) = from_args(args)?;
                let mut items = self.items();
                if items.is_empty() {
                    return Err(error("pop: the list is empty"));
                }
                let last = items.len() - 1;
                match at.map_or(Some(last), |i| position(i, items.len())) {
                    Some(i) => Ok(items.remove(i)),
                    None => Err(error("pop: the index is out of range")),
                }
            }
            "remove" => {
                let (item,): (Value,) = from_args(args)?;
                match self.snapshot().iter().position(|v| *v == item) {
                    Some(i) => {
                        self.items().remove(i);
                        Ok(none)
                    }
                    None => Err(error(&format!("remove: {item} is not in the list"))),
                }
            }
            "clear" => {
                let () = from_args(args)?;
                self.items().clear();
                Ok(none)
            }
            "index" => {
                let (item, start, stop): (Value, Option<i64>, Option<i64>) = from_args(args)?;
                let items = self.snapshot();
                let start = start.map_or(0, |i| bound(i, items.len()));
                let stop = stop.map_or(items.len(), |i| bound(i, items.len()));
                (start..stop.max(start))
                    .find(|&i| items[i] == item)
                    .map(Value::from)
                    .ok_or_else(|| error(&format!("index: {item} is not in the list")))
            }
            "count" => {
                let (item,): (Value,) = from_args(args)?;
                Ok(Value::from(
                    self.snapshot().iter().filter(|v| **v == item).count(),
                ))
            }
            // llama-server's `reverse` (its filter's): a new list, reversed; this one stays as
            // it is. (Python's reverses the list in place; jinja2's sandbox refuses it.)
            "reverse" => {
                let () = from_args(args)?;
                let mut items = self.snapshot();
                items.reverse();
                Ok(List::value(items))
            }
            "copy" => {
                let () = from_args(args)?;
                Ok(List::value(self.snapshot()))
            }
            _ => Err(Error::from(ErrorKind::UnknownMethod)),
        }
    }
}

/// `BUILD`: a new list of the items a literal's expressions gave.
pub fn build(items: minijinja::value::Rest<Value>) -> Value {
    List::value(items.0)
}

/// jinja2's `list` filter: a list the template can change, of the items of `value` (as
/// minijinja's filter reads them).
pub fn filter(state: &State<'_, '_>, value: Value) -> Result<Value, Error> {
    let items = minijinja::filters::list(state, value)?;
    Ok(List::value(items.try_iter()?.collect()))
}

/// `a + b` of two lists as Python adds them: a new list (minijinja's sum would go on reading
/// its operands, and show what is later appended to them).
pub fn concat(a: &Value, b: &Value) -> Result<Value, Error> {
    let mut items: Vec<Value> = a.try_iter()?.collect();
    items.extend(b.try_iter()?);
    Ok(List::value(items))
}

#[cfg(test)]
mod tests {
    use crate::chat::{ChatRequest, ChatTemplate};
    use crate::tools::test_util::{markup_text, template, Rng};
    use serde_json::{json, Value};

    /// `src` rendered for one user message with the variables `kwargs`.
    fn render(src: &str, kwargs: Value) -> Result<String, String> {
        let t = ChatTemplate::new(Some(src), "", "").map_err(|e| e.to_string())?;
        let body = json!({"messages": [{"role": "user", "content": "hi"}],
                          "chat_template_kwargs": kwargs});
        let req = ChatRequest::parse(body.as_object().unwrap()).map_err(|e| e.message)?;
        t.render_request(&req).map_err(|e| e.message)
    }

    /// An item for a template to add: the `k`th of the variable `v` (a random string or
    /// number, which the template builds lists of) or a number written in the template (a
    /// constant list, where all of a literal's items are).
    fn item(rng: &mut Rng, values: &mut Vec<Value>) -> (String, Value) {
        if rng.below(2) == 0 {
            let n = rng.below(90) as i64 + 10;
            return (n.to_string(), json!(n));
        }
        let v = if rng.below(2) == 0 {
            json!(format!("x{}y", markup_text(rng, 1, 12)))
        } else {
            json!(rng.below(1000) as i64 - 500)
        };
        values.push(v.clone());
        (format!("v[{}]", values.len() - 1), v)
    }

    /// Random runs of `append`, `extend`, `insert`, `pop`, `remove`, `index`, `count`,
    /// `reverse` and `+` leave the list, and give the results, that Python's list methods
    /// would (the model below: Python's rules for negative and out-of-range indexes), but
    /// `reverse` as llama-server's: a reversed copy, the list left as it was (Python's
    /// reverses in place; jinja2's sandbox, transformers', refuses it).
    #[test]
    fn list_methods_do_as_pythons() {
        let mut rng = Rng(0x115_7A99E);
        for round in 0..60 {
            let mut values = Vec::new();
            let mut src = String::from("{%- set xs = [] -%}{%- set out = [] -%}");
            let (mut xs, mut out): (Vec<Value>, Vec<Value>) = (Vec::new(), Vec::new());
            for _ in 0..rng.below(14) + 4 {
                let n = xs.len() as i64;
                match rng.below(9) {
                    0 | 1 => {
                        let (e, v) = item(&mut rng, &mut values);
                        src += &format!("{{%- set _ = xs.append({e}) -%}}");
                        xs.push(v);
                    }
                    2 => {
                        let (a, va) = item(&mut rng, &mut values);
                        let (b, vb) = item(&mut rng, &mut values);
                        src += &format!("{{%- set _ = xs.extend([{a}, {b}]) -%}}");
                        xs.extend([va, vb]);
                    }
                    3 => {
                        let (e, v) = item(&mut rng, &mut values);
                        let at = rng.below(2 * n as usize + 3) as i64 - n - 1;
                        src += &format!("{{%- set _ = xs.insert({at}, {e}) -%}}");
                        let i = if at < 0 { (at + n).max(0) } else { at.min(n) };
                        xs.insert(i as usize, v);
                    }
                    4 if n > 0 => {
                        let at = rng.below(2 * n as usize) as i64 - n;
                        src += &format!("{{%- set _ = out.append(xs.pop({at})) -%}}");
                        out.push(xs.remove(if at < 0 { at + n } else { at } as usize));
                    }
                    5 if n > 0 => {
                        src += "{%- set _ = out.append(xs.pop()) -%}";
                        out.extend(xs.pop());
                    }
                    6 if n > 0 => {
                        let k = rng.below(n as usize);
                        let it = xs[k].clone();
                        let lit = it.to_string();
                        let first = xs.iter().position(|v| *v == it).unwrap();
                        let count = xs.iter().filter(|v| **v == it).count();
                        src += &format!(
                            "{{%- set _ = out.append(xs.index(xs[{k}])) -%}}\
                             {{%- set _ = out.append(xs.count(xs[{k}])) -%}}"
                        );
                        out.extend([json!(first), json!(count)]);
                        if it.is_i64() {
                            src += &format!("{{%- set _ = xs.remove({lit}) -%}}");
                            xs.remove(first);
                        }
                    }
                    7 => {
                        // llama-server's: a reversed copy, `xs` as it was.
                        src += "{%- set _ = out.append(xs.reverse()) -%}";
                        out.push(Value::Array(xs.iter().rev().cloned().collect()));
                    }
                    _ => {
                        // A sum is a new list: what is later added to `xs` is not in it.
                        src += "{%- set _ = out.append(xs + [1]) -%}";
                        out.push(Value::Array(xs.iter().cloned().chain([json!(1)]).collect()));
                    }
                }
            }
            src += "{{ [out, xs, xs|length] | tojson }}";
            let got = render(&src, json!({ "v": values })).unwrap();
            let got: Value = serde_json::from_str(&got).unwrap();
            assert_eq!(got, json!([out, xs, xs.len()]), "round {round}: {src}");
        }
    }

    /// A list literal is a new list each time it runs, as in Python: a `[]` (or `[x]`) in a
    /// loop starts afresh on each turn, and a list once built is not changed by another's
    /// methods. A list made by `|list` can change too. A changed list reads as a list (`is
    /// sequence`, `in`, slices, equality, items by negative index, printing).
    #[test]
    fn each_list_literal_is_a_new_list() {
        let mut rng = Rng(0xF8E5_4115);
        for _ in 0..20 {
            let n = rng.below(5) + 2;
            let [a, b] = std::array::from_fn(|_| format!("x{}y", markup_text(&mut rng, 1, 12)));
            let kw = json!({"n": n, "a": a, "b": b});
            let fresh = "{%- for i in range(n) -%}{%- set ys = [] -%}{%- set zs = [a] -%}\
                         {%- set ns = namespace(l=[]) -%}\
                         {%- set _ = ys.append(i) -%}{%- set _ = zs.append(i) -%}\
                         {%- set _ = ns.l.append(b) -%}\
                         {{ ys|length }}{{ zs|length }}{{ ns.l|length }},{%- endfor -%}";
            assert_eq!(render(fresh, kw.clone()).unwrap(), "121,".repeat(n));
            let reads =
                "{%- set xs = [] -%}{%- set _ = xs.append(a) -%}{%- set _ = xs.append(b) -%}\
                         {{ xs is sequence }} {{ a in xs }} {{ xs[-1] == b }} {{ xs[1:] == [b] }} \
                         {{ xs == [a, b] }} {{ xs|join('|') }} {{ xs }} {{ xs|last == b }}";
            let printed = render("{{ [a, b] }}", kw.clone()).unwrap();
            assert_eq!(
                render(reads, kw.clone()).unwrap(),
                format!("True True True True True {a}|{b} {printed} True")
            );
            // A list made by the `list` filter changes too.
            let listed = "{%- set l = a|list -%}{%- set _ = l.append(b) -%}{{ l|join }}";
            assert_eq!(render(listed, kw.clone()).unwrap(), format!("{a}{b}"));
            // (the constant list `[1, 2]` too: each run of it is new)
            let constant = "{%- for i in range(n) -%}{%- set c = [1, 2] -%}\
                            {%- set _ = c.append(i) -%}{{ c|length }}{%- endfor -%}";
            assert_eq!(render(constant, kw).unwrap(), "3".repeat(n));
        }
    }

    /// What Python refuses is an error naming it, never a panic: `pop` of an empty list or
    /// past its end, `remove` or `index` of an item it lacks, a list added to itself.
    #[test]
    fn bad_list_operations_are_errors() {
        for (src, says) in [
            ("{{ [].pop() }}", "empty"),
            ("{% set l = [1] %}{{ l.pop(3) }}", "out of range"),
            ("{% set l = [1] %}{{ l.pop(-2) }}", "out of range"),
            ("{% set l = [1] %}{{ l.remove(2) }}", "not in the list"),
            ("{% set l = [1, 2] %}{{ l.index(1, 1) }}", "not in the list"),
            ("{% set l = [] %}{{ l.append(l) }}", "itself"),
            (
                "{% set l = [] %}{% set m = [l] %}{{ l.extend([m]) }}",
                "itself",
            ),
        ] {
            let e = render(src, json!({})).unwrap_err();
            assert!(e.contains(says), "{src}: {e}");
        }
    }

    /// A request's variable named as a list's function (`[]`, `[0]`: names no template
    /// can write) does not replace it: the template's lists are as before.
    #[test]
    fn a_request_variable_does_not_replace_a_list() {
        let src = "{% set l = [] %}{% set m = [n] %}{% set _ = l.append(1) %}{{ l + m }}";
        for name in ["[]", "[0]"] {
            assert_eq!(render(src, json!({"n": 5, name: 7})).unwrap(), "[1, 5]");
        }
    }

    /// llama-server's prompt for a conversation with three tool calls in two turns and their
    /// results in Kimi K2's template (`/apply-template`, llama.cpp b0.3.36): the template
    /// queues the calls' ids (`functions.NAME:IDX`) with `append` and takes each result's with
    /// `pop(0)`.
    const KIMI_K2_LLAMA_SERVER: &str = include_str!("testdata/kimi-k2-llama-server.txt");

    #[test]
    fn kimi_k2_renders_tool_results_with_their_calls_ids() {
        let Some(src) = template("Kimi-K2-Instruct.jinja") else {
            return;
        };
        let t = ChatTemplate::new(Some(&src), "", "").unwrap();
        let body: Value =
            serde_json::from_str(include_str!("testdata/kimi-k2-conversation.json")).unwrap();
        let mut req = ChatRequest::parse(body.as_object().unwrap()).unwrap();
        // (as the server gives them, once `tools::parse_tools` has read them)
        req.tools = body.get("tools").cloned();
        assert_eq!(t.render_request(&req).unwrap(), KIMI_K2_LLAMA_SERVER);
        // Random names, arguments and results, 2-3 calls in one or two turns.
        let mut rng = Rng(0x4B1_3A2);
        for _ in 0..20 {
            let mut messages = vec![json!({"role": "user", "content": "go"})];
            let (mut want, mut calls_want, mut idx) = (Vec::new(), Vec::new(), 0);
            for _turn in 0..rng.below(2) + 1 {
                let calls: Vec<(String, String)> = (0..rng.below(2) + 1)
                    .map(|_| {
                        let name = format!("f{}", rng.below(1000));
                        (name, format!("x{}y", markup_text(&mut rng, 1, 10)))
                    })
                    .collect();
                messages.push(json!({"role": "assistant", "content": "",
                    "tool_calls": calls.iter().enumerate().map(|(i, (name, arg))| json!({
                        "id": format!("c{idx}_{i}"), "type": "function",
                        "function": {"name": name, "arguments": json!({"a": arg}).to_string()}
                    })).collect::<Vec<_>>()}));
                for (i, (name, _)) in calls.iter().enumerate() {
                    let result = format!("r{}", rng.below(1_000_000));
                    messages.push(
                        json!({"role": "tool", "tool_call_id": format!("c{idx}_{i}"),
                                         "content": result}),
                    );
                    want.push(format!(
                        "## Return of functions.{name}:{}\n{result}",
                        idx + i
                    ));
                }
                for (i, (name, _)) in calls.iter().enumerate() {
                    calls_want.push(format!(
                        "<|tool_call_begin|>functions.{name}:{}<|tool_call_argument_begin|>",
                        idx + i
                    ));
                }
                idx += calls.len();
            }
            let body = json!({ "messages": messages });
            let req = ChatRequest::parse(body.as_object().unwrap()).unwrap();
            let got = t.render_request(&req).unwrap();
            // The calls in order, each result after its call.
            let mut at = 0;
            for (call, result) in calls_want.iter().zip(&want) {
                at += got[at..]
                    .find(call.as_str())
                    .unwrap_or_else(|| panic!("{call:?} {got:?}"));
                assert!(got[at..].contains(result.as_str()), "{result:?} {got:?}");
            }
        }
    }
}
