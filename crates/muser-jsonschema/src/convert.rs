//! The schema walk: one grammar rule per (sub)schema.

use std::collections::HashMap;

use serde_json::{Map, Value};

use crate::grammar::{class_char, literal, repeat, Rules};
use crate::merge::{self, is_constraining, json_eq, kind_of, type_mask, Analysis, FlatCx};
use crate::numeric::{self, Bound, Decimal};
use crate::pattern::{pattern_grammar, PatternGrammar, MAX_REPEAT};
use crate::{child_ptr, SchemaError, MAX_DEPTH};

type Obj = Map<String, Value>;
type Res<T> = Result<T, SchemaError>;

const TYPES: &[&str] = &[
    "null", "boolean", "object", "array", "number", "integer", "string",
];
const OBJECT_KWS: &[&str] = &[
    "properties",
    "required",
    "additionalProperties",
    "minProperties",
    "maxProperties",
    "unevaluatedProperties",
];
const ARRAY_KWS: &[&str] = &[
    "items",
    "prefixItems",
    "additionalItems",
    "minItems",
    "maxItems",
    "uniqueItems",
];
const STRING_KWS: &[&str] = &["minLength", "maxLength", "pattern"];
const NUMBER_KWS: &[&str] = &[
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
];

/// String formats with a grammar: (format, rule, min length, max length).
const FORMATS: &[(&str, &str, u64, u64)] = &[
    ("date", "fmt-date", 10, 10),
    ("time", "fmt-time", 9, 24),
    ("date-time", "fmt-date-time", 20, 35),
    ("uuid", "fmt-uuid", 36, 36),
    ("ipv4", "fmt-ipv4", 7, 15),
    ("hostname", "fmt-hostname", 1, 215),
    ("idn-hostname", "fmt-hostname", 1, 215),
    ("email", "fmt-email", 3, 278),
    ("idn-email", "fmt-email", 3, 278),
    ("uri", "fmt-uri", 8, 396),
    ("uri-reference", "fmt-uri", 8, 396),
    ("iri", "fmt-uri", 8, 396),
    ("iri-reference", "fmt-uri", 8, 396),
];

/// Formats defined by JSON Schema that validators check but this converter cannot express.
const UNSUPPORTED_FORMATS: &[&str] = &[
    "ipv6",
    "duration",
    "json-pointer",
    "relative-json-pointer",
    "regex",
    "uri-template",
];

pub(crate) struct Converter<'a> {
    root: &'a Value,
    rules: Rules,
    /// target pointer -> rule name
    refs: HashMap<String, String>,
    /// rule name -> `$ref` text, for error messages
    ref_names: HashMap<String, (String, String)>,
    /// (rule name, target pointer)
    pending: Vec<(String, String)>,
    /// `allOf`/`$ref` folding state, with the work budget of the whole conversion
    flat: FlatCx,
    /// grammar bytes already paid for out of the budget
    charged_bytes: usize,
    /// pattern -> its grammar (helper rules are shared by body, so the result does not
    /// depend on where the pattern is)
    patterns: HashMap<String, PatternGrammar>,
}

/// Pattern characters converted per unit of work.
const PATTERN_CHARS_PER_WORK: usize = 2;

/// Grammar bytes built per unit of work.
const BYTES_PER_WORK: usize = 64;

/// The value at a JSON pointer written `#/a/b` (RFC 6901 escaping, no percent-decoding).
fn resolve_plain_pointer<'v>(root: &'v Value, pointer: &str) -> Res<&'v Value> {
    let Some(path) = pointer.strip_prefix('#') else {
        return Err(SchemaError::invalid(
            "pointer",
            "#",
            format!("`{pointer}` is not a JSON pointer starting with `#`"),
        ));
    };
    let mut cur = root;
    if path.is_empty() {
        return Ok(cur);
    }
    let Some(path) = path.strip_prefix('/') else {
        return Err(SchemaError::invalid(
            "pointer",
            "#",
            format!("`{pointer}` is not a JSON pointer starting with `#/`"),
        ));
    };
    for raw in path.split('/') {
        let (tok, next) = crate::merge::pointer_step(cur, raw);
        cur = next.ok_or_else(|| {
            SchemaError::invalid(
                "pointer",
                "#",
                format!("`{pointer}` does not resolve (no `{tok}`)"),
            )
        })?;
    }
    Ok(cur)
}

fn count(m: &Obj, kw: &str, ptr: &str) -> Res<Option<u64>> {
    let Some(v) = m.get(kw) else { return Ok(None) };
    let n = v.as_u64().or_else(|| {
        v.as_f64()
            .filter(|f| *f >= 0.0 && f.fract() == 0.0)
            .map(|f| if f > 1e18 { u64::MAX } else { f as u64 })
    });
    match n {
        Some(n) => Ok(Some(n)),
        None => Err(SchemaError::invalid(
            kw,
            ptr,
            "must be a non-negative integer",
        )),
    }
}

fn too_many(kw: &str, ptr: &str) -> SchemaError {
    SchemaError::unsupported(kw, ptr, format!("counts above {MAX_REPEAT}"))
}

fn json_text(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

impl<'a> Converter<'a> {
    pub fn new(root: &'a Value) -> Self {
        Converter {
            root,
            rules: Rules::default(),
            refs: HashMap::new(),
            ref_names: HashMap::new(),
            pending: Vec::new(),
            flat: FlatCx::default(),
            charged_bytes: 0,
            patterns: HashMap::new(),
        }
    }

    pub fn run(self) -> Res<String> {
        let (top, rules) = self.build("#")?;
        Ok(rules.render(&top))
    }

    /// Converts the subschema at `pointer` (`#` for the whole document; `$ref`s resolve
    /// against the whole document); returns the name of its rule and the rule table.
    pub fn build(mut self, pointer: &str) -> Res<(String, Rules)> {
        let start = resolve_plain_pointer(self.root, pointer)?;
        let hint = match pointer.rsplit('/').next() {
            Some(last) if pointer != "#" => last.to_string(),
            _ => "root".to_string(),
        };
        let top = self.schema(start, pointer, &hint, 0)?;
        while let Some((name, tptr)) = self.pending.pop() {
            let (_, site) = self.ref_names.get(&name).cloned().unwrap_or_default();
            let target = self.resolve_pointer(&tptr, &site)?;
            let body = self.schema(target, &tptr, &name, 0)?;
            self.rules.define_alias(&name, &body);
        }
        if let Some(r) = self.rules.left_recursive_rule() {
            let (text, site) = self
                .ref_names
                .get(&r)
                .cloned()
                .unwrap_or_else(|| (r.clone(), "#".to_string()));
            return Err(SchemaError::unsupported(
                "$ref",
                &site,
                format!(
                    "`{text}` recurses without any enclosing object, array or string \
                     (left recursion)"
                ),
            ));
        }
        Ok((top, self.rules))
    }

    fn resolve_pointer(&self, tptr: &str, site: &str) -> Res<&'a Value> {
        merge::resolve_ref(self.root, tptr, site).map(|(v, _)| v)
    }

    /// Checks the work and size limits, charging the grammar text built since the last check.
    fn check_limits(&mut self, kw: &str, ptr: &str) -> Res<()> {
        let touched = self.rules.touched();
        let units = (touched / BYTES_PER_WORK).saturating_sub(self.charged_bytes / BYTES_PER_WORK);
        self.charged_bytes = touched;
        self.flat.budget.spend(1 + units as u64, kw, ptr)?;
        match self.rules.over_limit() {
            Some(why) => Err(SchemaError::too_complex(kw, ptr, why)),
            None => Ok(()),
        }
    }

    /// Converts one schema; returns the name of its rule.
    fn schema(&mut self, s: &Value, ptr: &str, hint: &str, depth: usize) -> Res<String> {
        self.check_limits("schema", ptr)?;
        let r = self.schema_inner(s, ptr, hint, depth)?;
        self.check_limits("schema", ptr)?;
        Ok(r)
    }

    fn schema_inner(&mut self, s: &Value, ptr: &str, hint: &str, depth: usize) -> Res<String> {
        if depth > MAX_DEPTH {
            return Err(SchemaError::too_deep("schema", ptr));
        }
        let m = match s {
            Value::Bool(true) => return Ok(self.rules.fixed("json-value")),
            Value::Bool(false) => {
                return Err(SchemaError::unsat(
                    "false",
                    ptr,
                    "the schema `false` matches nothing",
                ))
            }
            Value::Object(m) => m,
            _ => {
                return Err(SchemaError::invalid(
                    "schema",
                    ptr,
                    "a schema must be an object or a boolean",
                ))
            }
        };
        check_keywords(m, ptr)?;
        let has = |k: &str| m.contains_key(k);
        let others = |skip: &[&str]| {
            m.keys()
                .any(|k| is_constraining(k) && !skip.contains(&k.as_str()))
        };
        let combined = has("allOf")
            || (has("anyOf") && has("oneOf"))
            || (has("$ref") && others(&["$ref"]))
            || ((has("anyOf") || has("oneOf")) && others(&["anyOf", "oneOf"]));
        if combined {
            let flat = merge::flatten(&mut self.flat, self.root, s, ptr, &mut Vec::new(), depth)?;
            return self.schema(&flat.into_value(), ptr, hint, depth + 1);
        }
        if let Some(r) = m.get("$ref") {
            return self.reference(r, ptr, hint);
        }
        for kw in ["anyOf", "oneOf"] {
            if let Some(a) = m.get(kw) {
                return self.alternatives(kw, a, ptr, hint, depth);
            }
        }
        if has("const") || has("enum") {
            return self.constant(m, ptr, hint);
        }
        let types = self.types(m, ptr)?;
        if types.is_empty() {
            return Ok(self.rules.fixed("json-value"));
        }
        let mut alts = Vec::new();
        for t in types {
            alts.push(self.typed(t, m, ptr, hint, depth)?);
        }
        Ok(self.rules.add_union(hint, &alts))
    }

    fn reference(&mut self, r: &Value, ptr: &str, hint: &str) -> Res<String> {
        let Some(text) = r.as_str() else {
            return Err(SchemaError::invalid("$ref", ptr, "must be a string"));
        };
        let (_, tptr) = merge::resolve_ref(self.root, text, ptr)?;
        if let Some(n) = self.refs.get(&tptr) {
            return Ok(n.clone());
        }
        let last = tptr.rsplit('/').next().unwrap_or(hint);
        let name = self
            .rules
            .reserve(if last == "#" { "root-ref" } else { last });
        self.refs.insert(tptr.clone(), name.clone());
        self.ref_names
            .insert(name.clone(), (text.to_string(), ptr.to_string()));
        self.pending.push((name.clone(), tptr));
        Ok(name)
    }

    fn alternatives(
        &mut self,
        kw: &str,
        a: &Value,
        ptr: &str,
        hint: &str,
        depth: usize,
    ) -> Res<String> {
        let arr = merge::non_empty_array(a, kw, ptr)?;
        let kptr = child_ptr(ptr, kw);
        let mut rules = Vec::new();
        let mut kept: Vec<&Value> = Vec::new();
        for (i, alt) in arr.iter().enumerate() {
            match self.schema(alt, &child_ptr(&kptr, &i.to_string()), hint, depth + 1) {
                Ok(r) => {
                    rules.push(r);
                    kept.push(alt);
                }
                // an alternative that can match nothing does not change the union
                Err(SchemaError::Unsatisfiable { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        if rules.is_empty() {
            return Err(SchemaError::unsat(kw, ptr, "no alternative can match"));
        }
        if kw == "oneOf" {
            let mut an = Analysis::new(self.root, &mut self.flat.budget);
            for i in 0..arr.len() {
                for j in i + 1..arr.len() {
                    let d = an.disjoint(&arr[i], &arr[j], 0);
                    if an.exhausted() {
                        return Err(SchemaError::too_complex(
                            "oneOf",
                            ptr,
                            format!(
                                "checking that the alternatives exclude each other takes more \
                                 than {} steps",
                                crate::MAX_WORK
                            ),
                        ));
                    }
                    if !d {
                        return Err(SchemaError::unsupported(
                            "oneOf",
                            ptr,
                            format!(
                                "alternatives {i} and {j} may both match (oneOf needs them to \
                                 differ in type, in const/enum values, or in the const value \
                                 of a required property); use anyOf"
                            ),
                        ));
                    }
                }
            }
        }
        Ok(self.rules.add_union(hint, &rules))
    }

    fn constant(&mut self, m: &Obj, ptr: &str, hint: &str) -> Res<String> {
        let mut values: Vec<&Value> = match m.get("enum") {
            None => Vec::new(),
            Some(Value::Array(a)) if !a.is_empty() => a.iter().collect(),
            Some(_) => {
                return Err(SchemaError::invalid(
                    "enum",
                    ptr,
                    "must be a non-empty array",
                ))
            }
        };
        if let Some(c) = m.get("const") {
            if m.contains_key("enum") && !values.iter().any(|v| json_eq(v, c)) {
                return Err(SchemaError::unsat(
                    "const",
                    ptr,
                    "the constant is not in enum",
                ));
            }
            values = vec![c];
        }
        let kw = if m.contains_key("const") {
            "const"
        } else {
            "enum"
        };
        if let Some(other) = m
            .keys()
            .find(|k| is_constraining(k) && !matches!(k.as_str(), "const" | "enum" | "type"))
        {
            return Err(SchemaError::unsupported(
                other,
                ptr,
                format!("`{other}` together with `{kw}`"),
            ));
        }
        if let Some(t) = m.get("type") {
            let names = self.type_list(t, ptr)?;
            let mask = names.iter().fold(0u8, |acc, n| acc | type_mask(n));
            values.retain(|v| kind_of(v) & mask != 0);
        }
        let mut lits: Vec<String> = Vec::new();
        for v in values {
            let l = self.value_grammar(v, 0);
            if !lits.contains(&l) {
                lits.push(l);
            }
        }
        if lits.is_empty() {
            return Err(SchemaError::unsat(kw, ptr, "no value has the allowed type"));
        }
        Ok(self.rules.add(hint, lits.join(" | ")))
    }

    /// Grammar for exactly one JSON value, with whitespace allowed between its tokens.
    fn value_grammar(&mut self, v: &Value, depth: usize) -> String {
        let ws = self.rules.fixed("ws");
        match v {
            Value::Array(a) if !a.is_empty() && depth < MAX_DEPTH => {
                let items: Vec<String> =
                    a.iter().map(|x| self.value_grammar(x, depth + 1)).collect();
                format!(
                    r#""[" {ws} {} {ws} "]""#,
                    items.join(&format!(r#" "," {ws} "#))
                )
            }
            Value::Object(m) if !m.is_empty() && depth < MAX_DEPTH => {
                let items: Vec<String> = m
                    .iter()
                    .map(|(k, x)| {
                        let key = literal(&json_text(&Value::String(k.clone())));
                        let val = self.value_grammar(x, depth + 1);
                        format!(r#"{key} {ws} ":" {ws} {val}"#)
                    })
                    .collect();
                format!(
                    r#""{{" {ws} {} {ws} "}}""#,
                    items.join(&format!(r#" "," {ws} "#))
                )
            }
            Value::Array(a) if a.is_empty() => format!(r#""[" {ws} "]""#),
            Value::Object(m) if m.is_empty() => format!(r#""{{" {ws} "}}""#),
            other => literal(&json_text(other)),
        }
    }

    fn type_list(&self, t: &Value, ptr: &str) -> Res<Vec<&'static str>> {
        let names: Vec<&str> = match t {
            Value::String(s) => vec![s.as_str()],
            Value::Array(a) if !a.is_empty() => {
                let mut v = Vec::new();
                for x in a {
                    let Some(s) = x.as_str() else {
                        return Err(SchemaError::invalid(
                            "type",
                            ptr,
                            "must be a string or a non-empty array of strings",
                        ));
                    };
                    v.push(s);
                }
                v
            }
            _ => {
                return Err(SchemaError::invalid(
                    "type",
                    ptr,
                    "must be a string or a non-empty array of strings",
                ))
            }
        };
        let mut out: Vec<&'static str> = Vec::new();
        for n in names {
            let Some(t) = TYPES.iter().find(|t| **t == n) else {
                return Err(SchemaError::invalid(
                    "type",
                    ptr,
                    format!("unknown type `{n}`"),
                ));
            };
            if !out.contains(t) {
                out.push(t);
            }
        }
        Ok(out)
    }

    /// Explicit types, or the types implied by the keywords present (empty = any value).
    fn types(&self, m: &Obj, ptr: &str) -> Res<Vec<&'static str>> {
        if let Some(t) = m.get("type") {
            return self.type_list(t, ptr);
        }
        let mut out = Vec::new();
        let any = |kws: &[&str]| kws.iter().any(|k| m.contains_key(*k));
        if any(OBJECT_KWS) {
            out.push("object");
        }
        if any(ARRAY_KWS) {
            out.push("array");
        }
        let string_format = m
            .get("format")
            .and_then(Value::as_str)
            .is_some_and(|f| FORMATS.iter().any(|x| x.0 == f) || UNSUPPORTED_FORMATS.contains(&f));
        if any(STRING_KWS) || string_format {
            out.push("string");
        }
        if any(NUMBER_KWS) {
            out.push("number");
        }
        Ok(out)
    }

    fn typed(&mut self, t: &str, m: &Obj, ptr: &str, hint: &str, depth: usize) -> Res<String> {
        match t {
            "null" => Ok(self.rules.fixed("json-null")),
            "boolean" => Ok(self.rules.fixed("json-bool")),
            "integer" => self.integer(m, ptr, hint),
            "number" => self.number(m, ptr, hint),
            "string" => self.string(m, ptr, hint),
            "array" => self.array(m, ptr, hint, depth),
            _ => self.object(m, ptr, hint, depth),
        }
    }

    // ---- numbers ------------------------------------------------------------------------

    fn bounds(&self, m: &Obj, ptr: &str) -> Res<(Option<Bound>, Option<Bound>)> {
        let num = |kw: &str| -> Res<Option<Decimal>> {
            match m.get(kw) {
                None => Ok(None),
                Some(Value::Number(n)) => Ok(Decimal::from_number(n)),
                Some(Value::Bool(_)) if kw.starts_with("exclusive") => Ok(None),
                Some(_) => Err(SchemaError::invalid(kw, ptr, "must be a number")),
            }
        };
        // draft-04 style: exclusiveMinimum/exclusiveMaximum as booleans
        let flag = |kw: &str| m.get(kw) == Some(&Value::Bool(true));
        let lo = numeric::stricter_lower(
            num("minimum")?.map(|v| Bound {
                v,
                excl: flag("exclusiveMinimum"),
            }),
            num("exclusiveMinimum")?.map(|v| Bound { v, excl: true }),
        );
        let hi = numeric::stricter_upper(
            num("maximum")?.map(|v| Bound {
                v,
                excl: flag("exclusiveMaximum"),
            }),
            num("exclusiveMaximum")?.map(|v| Bound { v, excl: true }),
        );
        Ok((lo, hi))
    }

    /// `multipleOf` is only accepted when it is 1 (i.e. "integer").
    fn multiple_of_one(&self, m: &Obj, ptr: &str) -> Res<bool> {
        match m.get("multipleOf") {
            None => Ok(false),
            Some(Value::Number(n)) if n.as_f64() == Some(1.0) => Ok(true),
            Some(Value::Number(n)) if n.as_f64().is_some_and(|f| f > 0.0) => Err(
                SchemaError::unsupported("multipleOf", ptr, "only multipleOf 1 can be expressed"),
            ),
            Some(_) => Err(SchemaError::invalid(
                "multipleOf",
                ptr,
                "must be a number greater than 0",
            )),
        }
    }

    fn integer(&mut self, m: &Obj, ptr: &str, hint: &str) -> Res<String> {
        self.multiple_of_one(m, ptr)?;
        let (lo, hi) = self.bounds(m, ptr)?;
        if lo.is_none() && hi.is_none() {
            return Ok(self.rules.fixed("json-integer"));
        }
        let lo_i = lo.as_ref().map(|b| int_bound(&b.v, b.excl, true));
        let hi_i = hi.as_ref().map(|b| int_bound(&b.v, b.excl, false));
        match numeric::int_range(lo_i, hi_i) {
            Some(body) => Ok(self.rules.add(hint, body)),
            None => Err(SchemaError::unsat(
                if lo.is_some() { "minimum" } else { "maximum" },
                ptr,
                "no integer (of at most 18 digits) lies within the bounds",
            )),
        }
    }

    fn number(&mut self, m: &Obj, ptr: &str, hint: &str) -> Res<String> {
        if self.multiple_of_one(m, ptr)? {
            return self.integer(m, ptr, hint);
        }
        let (lo, hi) = self.bounds(m, ptr)?;
        if lo.is_none() && hi.is_none() {
            return Ok(self.rules.fixed("json-number"));
        }
        match numeric::number_range(lo.as_ref(), hi.as_ref()) {
            Some(body) => Ok(self.rules.add(hint, body)),
            None => Err(SchemaError::unsat(
                if lo.is_some() { "minimum" } else { "maximum" },
                ptr,
                "no number (of at most 15 digits) lies within the bounds",
            )),
        }
    }

    // ---- strings ------------------------------------------------------------------------

    fn string(&mut self, m: &Obj, ptr: &str, hint: &str) -> Res<String> {
        let min = count(m, "minLength", ptr)?.unwrap_or(0);
        let max = count(m, "maxLength", ptr)?;
        if min > MAX_REPEAT {
            return Err(too_many("minLength", ptr));
        }
        if max.is_some_and(|x| x > MAX_REPEAT) {
            return Err(too_many("maxLength", ptr));
        }
        if max.is_some_and(|x| x < min) {
            return Err(SchemaError::unsat(
                "maxLength",
                ptr,
                "maxLength is below minLength",
            ));
        }
        let format = match m.get("format") {
            None => None,
            Some(Value::String(f)) => Some(f.as_str()),
            Some(_) => return Err(SchemaError::invalid("format", ptr, "must be a string")),
        };
        if let Some(f) = format {
            if UNSUPPORTED_FORMATS.contains(&f) {
                return Err(SchemaError::unsupported(
                    "format",
                    ptr,
                    format!("format `{f}` has no grammar"),
                ));
            }
            if let Some(&(_, rule, fmin, fmax)) = FORMATS.iter().find(|x| x.0 == f) {
                if m.contains_key("pattern") {
                    return Err(SchemaError::unsupported(
                        "pattern",
                        ptr,
                        format!("pattern together with format `{f}`"),
                    ));
                }
                if fmin < min || max.is_some_and(|x| fmax > x) {
                    return Err(SchemaError::unsupported(
                        if fmin < min { "minLength" } else { "maxLength" },
                        ptr,
                        format!("length limits together with format `{f}`"),
                    ));
                }
                let r = self.rules.fixed(rule);
                return Ok(self.rules.add(hint, format!(r#""\"" {r} "\"""#)));
            }
            // other formats are annotations only
        }
        if let Some(p) = m.get("pattern") {
            let Some(p) = p.as_str() else {
                return Err(SchemaError::invalid("pattern", ptr, "must be a string"));
            };
            let pg = match self.patterns.get(p) {
                Some(pg) => pg.clone(),
                None => {
                    let cost = (p.len() / PATTERN_CHARS_PER_WORK) as u64;
                    self.flat.budget.spend(cost, "pattern", ptr)?;
                    let pg = pattern_grammar(p, &mut self.rules, hint, ptr)?;
                    self.patterns.insert(p.to_string(), pg.clone());
                    pg
                }
            };
            let fits = pg.min_len >= min
                && match max {
                    None => true,
                    Some(x) => pg.max_len.is_some_and(|y| y <= x),
                };
            if !fits {
                return Err(SchemaError::unsupported(
                    "pattern",
                    ptr,
                    "pattern together with minLength/maxLength that the pattern does not \
                     already imply",
                ));
            }
            let body = if pg.body.is_empty() {
                r#""\"\"""#.to_string()
            } else {
                format!(r#""\"" {} "\"""#, pg.body)
            };
            return Ok(self.rules.add(hint, body));
        }
        if min == 0 && max.is_none() {
            return Ok(self.rules.fixed("json-string"));
        }
        let c = self.rules.fixed("json-char");
        let inner = repeat(&c, min, max);
        let body = if inner.is_empty() {
            r#""\"\"""#.to_string()
        } else {
            format!(r#""\"" {inner} "\"""#)
        };
        Ok(self.rules.add(hint, body))
    }

    // ---- arrays -------------------------------------------------------------------------

    fn array(&mut self, m: &Obj, ptr: &str, hint: &str, depth: usize) -> Res<String> {
        let min = count(m, "minItems", ptr)?;
        let mut max = count(m, "maxItems", ptr)?;
        if min.is_some_and(|x| x > MAX_REPEAT) {
            return Err(too_many("minItems", ptr));
        }
        if max.is_some_and(|x| x > MAX_REPEAT) {
            return Err(too_many("maxItems", ptr));
        }
        let items = m.get("items");
        let (prefix, prefix_kw, tail): (&[Value], &str, Option<(&Value, &str)>) =
            match (m.get("prefixItems"), items) {
                (Some(Value::Array(_)), Some(Value::Array(_))) => {
                    return Err(SchemaError::invalid(
                        "items",
                        ptr,
                        "an array of schemas cannot be combined with prefixItems",
                    ));
                }
                (Some(Value::Array(p)), it) => (p, "prefixItems", it.map(|t| (t, "items"))),
                (Some(_), _) => {
                    return Err(SchemaError::invalid(
                        "prefixItems",
                        ptr,
                        "must be an array of schemas",
                    ))
                }
                (None, Some(Value::Array(p))) => (
                    p,
                    "items",
                    m.get("additionalItems").map(|t| (t, "additionalItems")),
                ),
                (None, Some(t)) => (&[], "items", Some((t, "items"))),
                (None, None) => (&[], "items", None),
            };
        // item schemas; a `false` prefix entry caps the length
        let pptr = child_ptr(ptr, prefix_kw);
        let mut prefix_rules = Vec::new();
        for (i, s) in prefix.iter().enumerate() {
            if s == &Value::Bool(false) {
                max = Some(max.map_or(i as u64, |x| x.min(i as u64)));
                break;
            }
            if max.is_some_and(|x| (i as u64) >= x) {
                break;
            }
            let hint_i = format!("{hint}-{i}");
            prefix_rules.push(self.schema(
                s,
                &child_ptr(&pptr, &i.to_string()),
                &hint_i,
                depth + 1,
            )?);
        }
        let n = prefix_rules.len() as u64;
        let tail_rule = match tail {
            Some((Value::Bool(false), _)) => None,
            Some((t, kw)) => {
                Some(self.schema(t, &child_ptr(ptr, kw), &format!("{hint}-item"), depth + 1)?)
            }
            // without prefix entries any item is allowed; after them, none (like llama.cpp)
            None if prefix.is_empty() => Some(self.rules.fixed("json-value")),
            None => None,
        };
        if tail_rule.is_none() {
            max = Some(max.map_or(n, |x| x.min(n)));
        }
        let min = min.unwrap_or(if prefix.is_empty() {
            0
        } else {
            n.min(max.unwrap_or(u64::MAX))
        });
        if let Some(x) = max {
            if x < min {
                return Err(SchemaError::unsat(
                    "minItems",
                    ptr,
                    "minItems exceeds the number of items allowed",
                ));
            }
        }
        match m.get("uniqueItems") {
            None | Some(Value::Bool(false)) => {}
            Some(Value::Bool(true)) => {
                if max.is_none_or(|x| x > 1) {
                    return Err(SchemaError::unsupported(
                        "uniqueItems",
                        ptr,
                        "distinct items cannot be enforced by a grammar (unless maxItems <= 1)",
                    ));
                }
            }
            Some(_) => {
                return Err(SchemaError::invalid(
                    "uniqueItems",
                    ptr,
                    "must be a boolean",
                ))
            }
        }
        let ws = self.rules.fixed("ws");
        if max == Some(0) {
            return Ok(self.rules.add(hint, format!(r#""[" {ws} "]""#)));
        }
        if prefix_rules.is_empty() {
            let t = tail_rule.unwrap_or_default();
            if t == "json-value" && min == 0 && max.is_none() {
                return Ok(self.rules.fixed("json-array"));
            }
            let rest = repeat(
                &format!(r#"( "," {ws} {t} )"#),
                min.saturating_sub(1),
                max.map(|x| x - 1),
            );
            let seq = [t.as_str(), rest.as_str(), ws.as_str()]
                .iter()
                .filter(|s| !s.is_empty())
                .copied()
                .collect::<Vec<_>>()
                .join(" ");
            let body = if min == 0 {
                format!(r#""[" {ws} ( {seq} )? "]""#)
            } else {
                format!(r#""[" {ws} {seq} "]""#)
            };
            return Ok(self.rules.add(hint, body));
        }
        // tuple: prefix entries in order (optional from index `min` on), then the tail
        let mut after = match &tail_rule {
            Some(t) if max.is_none_or(|x| x > n) => repeat(
                &format!(r#"( "," {ws} {t} )"#),
                min.saturating_sub(n),
                max.map(|x| x - n),
            ),
            _ => String::new(),
        };
        for i in (1..prefix_rules.len()).rev() {
            let inner = format!(r#""," {ws} {} {after}"#, prefix_rules[i]);
            let inner = inner.trim_end().to_string();
            after = if (i as u64) < min {
                inner
            } else {
                format!("( {inner} )?")
            };
        }
        let first = format!("{} {after} {ws}", prefix_rules[0]);
        let first = first.split_whitespace().collect::<Vec<_>>().join(" ");
        let body = if min == 0 {
            format!(r#""[" {ws} ( {first} )? "]""#)
        } else {
            format!(r#""[" {ws} {first} "]""#)
        };
        Ok(self.rules.add(hint, body))
    }

    // ---- objects ------------------------------------------------------------------------

    fn object(&mut self, m: &Obj, ptr: &str, hint: &str, depth: usize) -> Res<String> {
        let props: Vec<(&String, &Value)> = match m.get("properties") {
            None => Vec::new(),
            Some(Value::Object(p)) => p.iter().collect(),
            Some(_) => return Err(SchemaError::invalid("properties", ptr, "must be an object")),
        };
        let mut required: Vec<&str> = Vec::new();
        match m.get("required") {
            None => {}
            Some(Value::Array(a)) => {
                for x in a {
                    let Some(s) = x.as_str() else {
                        return Err(SchemaError::invalid(
                            "required",
                            ptr,
                            "must be an array of strings",
                        ));
                    };
                    if !required.contains(&s) {
                        required.push(s);
                    }
                }
            }
            Some(_) => {
                return Err(SchemaError::invalid(
                    "required",
                    ptr,
                    "must be an array of strings",
                ))
            }
        }
        let ap = m.get("additionalProperties");
        if let Some(v) = ap {
            if !v.is_boolean() && !v.is_object() {
                return Err(SchemaError::invalid(
                    "additionalProperties",
                    ptr,
                    "must be a boolean or a schema",
                ));
            }
        }
        let uneval_closed = m.get("unevaluatedProperties") == Some(&Value::Bool(false));
        const ANY: Value = Value::Bool(true);
        // the schema an undeclared property must satisfy (None: not allowed at all)
        let undeclared: Option<&Value> = match ap {
            Some(Value::Bool(false)) => None,
            Some(v) => Some(v),
            None if uneval_closed => None,
            None => Some(&ANY),
        };
        // whether the grammar offers undeclared properties: only when asked for explicitly,
        // or for objects without any `properties` (llama.cpp's default)
        let mut extras = match ap {
            Some(Value::Bool(false)) => false,
            Some(_) => true,
            None => !m.contains_key("properties") && !uneval_closed,
        };
        let min_props = count(m, "minProperties", ptr)?;
        let max_props = count(m, "maxProperties", ptr)?;
        if max_props.is_some() {
            extras = false; // leaving them out is always allowed
        }
        let pptr = child_ptr(ptr, "properties");
        let mut req_kvs: Vec<String> = Vec::new();
        let mut opt_kvs: Vec<String> = Vec::new();
        let mut names: Vec<&str> = Vec::new();
        let ws = self.rules.fixed("ws");
        let kv = |rules: &mut Rules, name: &str, value: &str| {
            let key = literal(&json_text(&Value::String(name.to_string())));
            rules.add(
                &format!("{hint}-{name}-kv"),
                format!(r#"{key} {ws} ":" {ws} {value}"#),
            )
        };
        // declared names (keys that additional properties must not use)
        let mut excluded: Vec<&str> = Vec::new();
        for (name, s) in &props {
            let is_req = required.contains(&name.as_str());
            excluded.push(name);
            if *s == &Value::Bool(false) {
                if is_req {
                    return Err(SchemaError::unsat(
                        "required",
                        ptr,
                        format!("property `{name}` is required but its schema is false"),
                    ));
                }
                continue;
            }
            let r = self.schema(
                s,
                &child_ptr(&pptr, name),
                &format!("{hint}-{name}"),
                depth + 1,
            )?;
            let k = kv(&mut self.rules, name, &r);
            if is_req {
                req_kvs.push(k);
            } else {
                opt_kvs.push(k);
            }
            names.push(name);
        }
        let mut undeclared_rule: Option<String> = None;
        let aptr = child_ptr(ptr, "additionalProperties");
        for name in &required {
            if props.iter().any(|(p, _)| p.as_str() == *name) {
                continue;
            }
            let Some(s) = undeclared else {
                return Err(SchemaError::unsat(
                    "required",
                    ptr,
                    format!(
                        "property `{name}` is required but additional properties are not allowed"
                    ),
                ));
            };
            let r = match &undeclared_rule {
                Some(r) => r.clone(),
                None => {
                    let r = self.schema(s, &aptr, &format!("{hint}-extra"), depth + 1)?;
                    undeclared_rule = Some(r.clone());
                    r
                }
            };
            req_kvs.push(kv(&mut self.rules, name, &r));
            names.push(name);
            excluded.push(name);
        }
        if let Some(mn) = min_props {
            if mn > req_kvs.len() as u64 {
                return Err(SchemaError::unsupported(
                    "minProperties",
                    ptr,
                    "minProperties above the number of required properties",
                ));
            }
        }
        if let Some(mx) = max_props {
            if mx < (req_kvs.len() + opt_kvs.len()) as u64 {
                return Err(SchemaError::unsupported(
                    "maxProperties",
                    ptr,
                    "maxProperties below the number of declared properties",
                ));
            }
        }
        let extra_kv = if extras {
            let s = undeclared.unwrap_or(&ANY);
            if excluded.is_empty() && is_any(s) {
                return Ok(self.rules.fixed("json-object"));
            }
            let value = match &undeclared_rule {
                Some(r) => r.clone(),
                None => self.schema(s, &aptr, &format!("{hint}-extra"), depth + 1)?,
            };
            let key_body = self.key_excluding(&excluded);
            let key = self.rules.add(&format!("{hint}-key"), key_body);
            Some(self.rules.add(
                &format!("{hint}-extra-kv"),
                format!(r#"{key} {ws} ":" {ws} {value}"#),
            ))
        } else {
            None
        };
        // optional members in order; the extra member repeats
        let mut opts: Vec<(String, bool)> = opt_kvs.into_iter().map(|k| (k, false)).collect();
        if let Some(e) = extra_kv {
            opts.push((e, true));
        }
        if req_kvs.is_empty() && opts.is_empty() {
            return Ok(self.rules.add(hint, format!(r#""{{" {ws} "}}""#)));
        }
        let group = |(k, many): &(String, bool)| {
            format!(r#"( "," {ws} {k} ){}"#, if *many { "*" } else { "?" })
        };
        let body = if !req_kvs.is_empty() {
            let mut parts = vec![req_kvs[0].clone()];
            for k in &req_kvs[1..] {
                parts.push(format!(r#""," {ws} {k}"#));
            }
            parts.extend(opts.iter().map(group));
            format!(r#""{{" {ws} {} {ws} "}}""#, parts.join(" "))
        } else {
            // the first member present carries no comma: one alternative per first member
            let mut tails: Vec<String> = vec![String::new(); opts.len() + 1];
            for j in (1..opts.len()).rev() {
                let g = group(&opts[j]);
                let t = if tails[j + 1].is_empty() {
                    g
                } else {
                    format!("{g} {}", tails[j + 1])
                };
                tails[j] = if opts.len() > 3 {
                    self.rules.add(&format!("{hint}-rest"), t)
                } else {
                    t
                };
            }
            let mut alts = Vec::new();
            for (i, (k, many)) in opts.iter().enumerate() {
                let mut a = k.clone();
                if *many {
                    a.push(' ');
                    a.push_str(&format!(r#"( "," {ws} {k} )*"#));
                }
                if !tails[i + 1].is_empty() {
                    a.push(' ');
                    a.push_str(&tails[i + 1]);
                }
                alts.push(a);
            }
            format!(r#""{{" {ws} ( ( {} ) {ws} )? "}}""#, alts.join(" | "))
        };
        Ok(self.rules.add(hint, body))
    }

    /// Body of a JSON string rule (with quotes) matching every key except `names`. Keys are
    /// spelled the way serde_json writes them, so each key has one spelling.
    fn key_excluding(&mut self, names: &[&str]) -> String {
        let kc = self.rules.fixed("key-char");
        if names.is_empty() {
            return format!(r#""\"" {kc}* "\"""#);
        }
        // trie over spelling units (a raw character or an escape sequence)
        struct Node {
            children: Vec<(String, usize)>,
            terminal: bool,
        }
        let mut nodes = vec![Node {
            children: Vec::new(),
            terminal: false,
        }];
        for name in names {
            let text = json_text(&Value::String(name.to_string()));
            let inner = &text[1..text.len() - 1];
            let mut cur = 0;
            for unit in spelling_units(inner) {
                let found = nodes[cur]
                    .children
                    .iter()
                    .find(|(u, _)| *u == unit)
                    .map(|x| x.1);
                cur = match found {
                    Some(c) => c,
                    None => {
                        nodes.push(Node {
                            children: Vec::new(),
                            terminal: false,
                        });
                        let id = nodes.len() - 1;
                        nodes[cur].children.push((unit, id));
                        id
                    }
                };
            }
            nodes[cur].terminal = true;
        }
        // children are created after their parent: fill expressions from the back
        let mut expr: Vec<String> = vec![String::new(); nodes.len()];
        for i in (0..nodes.len()).rev() {
            let node = &nodes[i];
            let mut alts = Vec::new();
            for (u, c) in &node.children {
                alts.push(format!("{} {}", literal(u), expr[*c]));
            }
            let raw_excl: String = node
                .children
                .iter()
                .filter(|(u, _)| !u.starts_with('\\'))
                .filter_map(|(u, _)| u.chars().next())
                .map(|c| class_char(c as u32))
                .collect();
            let esc_excl: Vec<&str> = node
                .children
                .iter()
                .filter(|(u, _)| u.starts_with('\\'))
                .map(|(u, _)| u.as_str())
                .collect();
            let raw = format!(r#"[^"\\\x00-\x1F{raw_excl}]"#);
            let first = if esc_excl.is_empty() {
                format!("( {raw} | key-esc )")
            } else {
                let mut escs: Vec<String> = ["\\\"", "\\\\", "\\b", "\\f", "\\n", "\\r", "\\t"]
                    .iter()
                    .map(|s| s.to_string())
                    .collect();
                for c in 0u32..0x20 {
                    if ![8, 9, 10, 12, 13].contains(&c) {
                        escs.push(format!("\\u{c:04x}"));
                    }
                }
                let escs: Vec<String> = escs
                    .into_iter()
                    .filter(|e| !esc_excl.contains(&e.as_str()))
                    .map(|e| literal(&e))
                    .collect();
                format!("( {raw} | {} )", escs.join(" | "))
            };
            alts.push(format!("{first} {kc}*"));
            let body = alts.join(" | ");
            expr[i] = if node.terminal {
                format!("( {body} )")
            } else {
                format!("( {body} )?")
            };
        }
        self.rules.fixed("key-esc");
        format!(r#""\"" {} "\"""#, expr[0])
    }
}

/// Splits serde_json's spelling of a string body into one unit per decoded character.
fn spelling_units(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        if c == '\\' {
            let mut u = String::from('\\');
            match it.next() {
                Some('u') => {
                    u.push('u');
                    for _ in 0..4 {
                        if let Some(h) = it.next() {
                            u.push(h);
                        }
                    }
                }
                Some(x) => u.push(x),
                None => {}
            }
            out.push(u);
        } else {
            out.push(c.to_string());
        }
    }
    out
}

fn is_any(v: &Value) -> bool {
    match v {
        Value::Bool(b) => *b,
        Value::Object(m) => m.keys().all(|k| !is_constraining(k)),
        _ => false,
    }
}

/// Smallest admissible integer for a lower bound (`lower`), largest for an upper bound.
fn int_bound(v: &Decimal, excl: bool, lower: bool) -> i128 {
    const CAP: i128 = 10i128.pow(30);
    let int: i128 = if v.int.len() > 30 {
        CAP
    } else {
        std::str::from_utf8(&v.int)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(CAP)
    };
    let has_frac = !v.frac.is_empty();
    // floor and ceil of the signed value
    let (floor, ceil) = if v.neg {
        (-(int + i128::from(has_frac)), -int)
    } else {
        (int, int + i128::from(has_frac))
    };
    match (lower, excl) {
        (true, false) => ceil,
        (true, true) => floor + 1,
        (false, false) => floor,
        (false, true) => ceil - 1,
    }
}

/// Rejects keywords the converter cannot honour.
fn check_keywords(m: &Obj, ptr: &str) -> Res<()> {
    let non_trivial = |v: &Value| match v {
        Value::Bool(true) => false,
        Value::Object(o) => !o.is_empty(),
        _ => true,
    };
    let non_empty = |v: &Value| match v {
        Value::Object(o) => !o.is_empty(),
        Value::Array(a) => !a.is_empty(),
        _ => true,
    };
    for (k, v) in m {
        let why: Option<&str> = match k.as_str() {
            "not" => Some("negation cannot be expressed by a grammar"),
            "if" if m.contains_key("then") || m.contains_key("else") => {
                Some("conditionals (if/then/else) are not supported")
            }
            "dependentRequired" | "dependentSchemas" | "dependencies" if non_empty(v) => {
                Some("dependencies between properties are not supported")
            }
            "patternProperties" if non_empty(v) => Some("patternProperties is not supported"),
            "propertyNames" if non_trivial(v) => Some("propertyNames is not supported"),
            "contains" => Some("contains is not supported"),
            "unevaluatedItems" if v != &Value::Bool(true) => {
                Some("unevaluatedItems is not supported")
            }
            "unevaluatedProperties" if !v.is_boolean() => {
                Some("unevaluatedProperties with a schema is not supported")
            }
            "$dynamicRef" | "$recursiveRef" => Some("dynamic references are not supported"),
            "$id" if ptr != "#" => Some("embedded resources with their own $id are not supported"),
            _ => None,
        };
        if let Some(why) = why {
            return Err(SchemaError::unsupported(k, ptr, why));
        }
    }
    Ok(())
}
