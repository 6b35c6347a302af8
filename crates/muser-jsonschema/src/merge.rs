//! `$ref` resolution, `allOf` merging (with sibling keywords distributed over
//! `anyOf`/`oneOf`), and the semantic checks used for `oneOf`.

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value};

use crate::budget::{map_weight, Budget};
use crate::numeric::Decimal;
use crate::{child_ptr, SchemaError, MAX_ALTERNATIVES, MAX_DEPTH};

type Obj = Map<String, Value>;
type Res<T> = Result<T, SchemaError>;

/// Keywords that carry no constraint on the instance (or only hold subschemas for `$ref`).
pub(crate) const ANNOTATIONS: &[&str] = &[
    "title",
    "description",
    "$schema",
    "$id",
    "$comment",
    "$anchor",
    "$dynamicAnchor",
    "$vocabulary",
    "examples",
    "example",
    "default",
    "deprecated",
    "readOnly",
    "writeOnly",
    "$defs",
    "definitions",
    "contentEncoding",
    "contentMediaType",
    "contentSchema",
    "nullable",
    "discriminator",
    "externalDocs",
    "xml",
];

/// Keywords with an effect on validation (as far as the converter knows them).
pub(crate) const CONSTRAINING: &[&str] = &[
    "type",
    "enum",
    "const",
    "properties",
    "required",
    "additionalProperties",
    "minProperties",
    "maxProperties",
    "patternProperties",
    "propertyNames",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
    "unevaluatedProperties",
    "items",
    "prefixItems",
    "additionalItems",
    "minItems",
    "maxItems",
    "uniqueItems",
    "contains",
    "minContains",
    "maxContains",
    "unevaluatedItems",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "if",
    "then",
    "else",
    "$ref",
    "$dynamicRef",
    "$recursiveRef",
];

pub(crate) fn is_constraining(k: &str) -> bool {
    CONSTRAINING.contains(&k)
}

/// Resolves a `$ref` against the document root; returns the target and its pointer.
pub(crate) fn resolve_ref<'v>(root: &'v Value, r: &str, ptr: &str) -> Res<(&'v Value, String)> {
    let frag = if let Some(f) = r.strip_prefix('#') {
        f
    } else {
        let id = root.get("$id").and_then(Value::as_str).unwrap_or("");
        let id = id.strip_suffix('#').unwrap_or(id);
        match r.strip_prefix(id) {
            Some(rest) if !id.is_empty() && (rest.is_empty() || rest.starts_with('#')) => {
                rest.strip_prefix('#').unwrap_or(rest)
            }
            _ => {
                return Err(SchemaError::unsupported(
                    "$ref",
                    ptr,
                    format!(
                        "`{r}`: only references into the same document (`#/...`) are supported"
                    ),
                ))
            }
        }
    };
    let frag = percent_decode(frag);
    if frag.is_empty() {
        return Ok((root, "#".to_string()));
    }
    let Some(path) = frag.strip_prefix('/') else {
        return Err(SchemaError::unsupported(
            "$ref",
            ptr,
            format!("`{r}`: plain-name fragments ($anchor) are not supported"),
        ));
    };
    let mut cur = root;
    let mut target = String::from("#");
    for raw in path.split('/') {
        let (tok, next) = pointer_step(cur, raw);
        let Some(n) = next else {
            return Err(SchemaError::invalid(
                "$ref",
                ptr,
                format!("`{r}` does not resolve (no `{tok}`)"),
            ));
        };
        cur = n;
        target = child_ptr(&target, &tok);
    }
    Ok((cur, target))
}

/// One step of a JSON pointer (RFC 6901): the token unescaped, and the value it names under
/// `cur` (an object's member, an array's element), if any.
pub(crate) fn pointer_step<'v>(cur: &'v Value, raw: &str) -> (String, Option<&'v Value>) {
    let tok = raw.replace("~1", "/").replace("~0", "~");
    let next = match cur {
        Value::Object(m) => m.get(&tok),
        Value::Array(a) => tok.parse::<usize>().ok().and_then(|i| a.get(i)),
        _ => None,
    };
    (tok, next)
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let h = std::str::from_utf8(&b[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            if let Some(v) = h {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// JSON equality with numbers compared by value.
pub(crate) fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            match (Decimal::from_number(x), Decimal::from_number(y)) {
                (Some(p), Some(q)) => p.cmp(&q).is_eq(),
                _ => x == y,
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| json_eq(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}

/// A schema with `$ref`/`allOf` folded in: one plain schema, or alternatives.
#[derive(Clone)]
pub(crate) enum Flat {
    Plain(Obj),
    Any(Vec<Obj>),
    One(Vec<Obj>),
}

impl Flat {
    pub fn into_value(self) -> Value {
        match self {
            Flat::Plain(m) => Value::Object(m),
            Flat::Any(v) => one_key("anyOf", v),
            Flat::One(v) => one_key("oneOf", v),
        }
    }

    fn into_obj(self) -> Obj {
        match self.into_value() {
            Value::Object(m) => m,
            _ => Obj::new(),
        }
    }

    fn weight(&self) -> u64 {
        match self {
            Flat::Plain(m) => map_weight(m),
            Flat::Any(v) | Flat::One(v) => 1 + v.iter().map(map_weight).sum::<u64>(),
        }
    }
}

fn one_key(k: &str, v: Vec<Obj>) -> Value {
    let mut m = Obj::new();
    m.insert(
        k.to_string(),
        Value::Array(v.into_iter().map(Value::Object).collect()),
    );
    Value::Object(m)
}

/// State shared by the `flatten` calls of one conversion.
#[derive(Default)]
pub(crate) struct FlatCx {
    pub budget: Budget,
    /// `$ref` target pointer -> its folded form (or why it matches nothing) and how many
    /// levels below it folding went
    memo: HashMap<String, (Res<Flat>, usize)>,
    /// deepest level reached by the current `flatten`
    reached: usize,
}

/// Drops repeated alternatives (`anyOf` is a union: repeats add nothing).
fn dedup(v: Vec<Obj>) -> Vec<Obj> {
    if v.len() < 2 {
        return v;
    }
    let mut seen = HashSet::new();
    v.into_iter()
        .filter(|m| seen.insert(serde_json::to_string(m).unwrap_or_default()))
        .collect()
}

fn check_alts(n: usize, kw: &str, ptr: &str) -> Res<()> {
    if n > MAX_ALTERNATIVES {
        return Err(SchemaError::too_complex(
            kw,
            ptr,
            format!(
                "combining allOf/$ref with anyOf/oneOf gives more than {MAX_ALTERNATIVES} \
                 alternatives"
            ),
        ));
    }
    Ok(())
}

/// Folds `$ref` and `allOf` of `s` into its other keywords and distributes them over
/// `anyOf`/`oneOf`. Only the top level is resolved; subschemas stay as they are.
pub(crate) fn flatten(
    cx: &mut FlatCx,
    root: &Value,
    s: &Value,
    ptr: &str,
    stack: &mut Vec<String>,
    depth: usize,
) -> Res<Flat> {
    if depth > MAX_DEPTH {
        return Err(SchemaError::too_deep("allOf", ptr));
    }
    cx.reached = cx.reached.max(depth);
    cx.budget.spend(1, "allOf", ptr)?;
    let m = match s {
        Value::Bool(true) => return Ok(Flat::Plain(Obj::new())),
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
    let mut base = Obj::new();
    for (k, v) in m {
        if !matches!(
            k.as_str(),
            "$ref" | "allOf" | "anyOf" | "oneOf" | "$defs" | "definitions"
        ) {
            base.insert(k.clone(), v.clone());
        }
    }
    cx.budget.spend(map_weight(&base), "allOf", ptr)?;
    // referenced and allOf parts first, so that their properties come first
    let mut acc = Flat::Plain(Obj::new());
    if let Some(r) = m.get("$ref") {
        let Some(rs) = r.as_str() else {
            return Err(SchemaError::invalid("$ref", ptr, "must be a string"));
        };
        let (target, tptr) = resolve_ref(root, rs, ptr)?;
        if stack.contains(&tptr) {
            return Err(SchemaError::unsupported(
                "$ref",
                ptr,
                format!(
                    "`{rs}` refers back to itself and is combined with other keywords or allOf"
                ),
            ));
        }
        let f = flatten_ref(cx, root, target, &tptr, stack, depth + 1)?;
        acc = merge(cx, acc, f, "$ref", ptr)?;
    }
    if let Some(all) = m.get("allOf") {
        let arr = non_empty_array(all, "allOf", ptr)?;
        let aptr = child_ptr(ptr, "allOf");
        for (i, sub) in arr.iter().enumerate() {
            let f = flatten(
                cx,
                root,
                sub,
                &child_ptr(&aptr, &i.to_string()),
                stack,
                depth + 1,
            )?;
            acc = merge(cx, acc, f, "allOf", ptr)?;
        }
    }
    acc = merge(cx, acc, Flat::Plain(base), "allOf", ptr)?;
    for kw in ["anyOf", "oneOf"] {
        let Some(alts) = m.get(kw) else { continue };
        let arr = non_empty_array(alts, kw, ptr)?;
        let kptr = child_ptr(ptr, kw);
        let mut out: Vec<Obj> = Vec::new();
        // anyOf is a union: repeated alternatives add nothing (oneOf keeps them: they clash)
        let mut seen: HashSet<String> = HashSet::new();
        let mut push = |out: &mut Vec<Obj>, m: Obj| {
            if kw == "oneOf" || seen.insert(serde_json::to_string(&m).unwrap_or_default()) {
                out.push(m);
            }
        };
        for (i, sub) in arr.iter().enumerate() {
            let sptr = child_ptr(&kptr, &i.to_string());
            match flatten(cx, root, sub, &sptr, stack, depth + 1) {
                Ok(Flat::Plain(p)) => push(&mut out, p),
                Ok(Flat::Any(v)) if kw == "anyOf" => {
                    for m in v {
                        push(&mut out, m);
                    }
                }
                Ok(f) => push(&mut out, f.into_obj()),
                // an alternative that matches nothing is simply left out
                Err(SchemaError::Unsatisfiable { .. }) => {}
                Err(e) => return Err(e),
            }
            check_alts(out.len(), kw, ptr)?;
        }
        if out.is_empty() {
            return Err(SchemaError::unsat(kw, ptr, "no alternative can match"));
        }
        let f = if kw == "anyOf" {
            Flat::Any(out)
        } else {
            Flat::One(out)
        };
        acc = merge(cx, acc, f, kw, ptr)?;
    }
    Ok(acc)
}

/// [`flatten`] of a `$ref` target (pushed on `stack` meanwhile), computed once per target.
/// The result does not depend on where the reference is: a cycle through the target fails
/// wherever it is entered, and the nesting depth it needs is checked on every use.
fn flatten_ref(
    cx: &mut FlatCx,
    root: &Value,
    target: &Value,
    tptr: &str,
    stack: &mut Vec<String>,
    depth: usize,
) -> Res<Flat> {
    if let Some((res, height)) = cx.memo.get(tptr) {
        if depth + height > MAX_DEPTH {
            return Err(SchemaError::too_deep("allOf", tptr));
        }
        cx.reached = cx.reached.max(depth + height);
        let res = res.clone();
        if let Ok(f) = &res {
            cx.budget.spend(f.weight(), "$ref", tptr)?;
        }
        return res;
    }
    let outer = cx.reached;
    cx.reached = depth;
    stack.push(tptr.to_string());
    let res = flatten(cx, root, target, tptr, stack, depth);
    stack.pop();
    let height = cx.reached - depth;
    cx.reached = cx.reached.max(outer);
    // only results that depend on the target alone are kept
    if matches!(res, Ok(_) | Err(SchemaError::Unsatisfiable { .. })) {
        cx.memo.insert(tptr.to_string(), (res.clone(), height));
    }
    res
}

pub(crate) fn non_empty_array<'v>(v: &'v Value, kw: &str, ptr: &str) -> Res<&'v Vec<Value>> {
    match v {
        Value::Array(a) if !a.is_empty() => Ok(a),
        _ => Err(SchemaError::invalid(
            kw,
            ptr,
            "must be a non-empty array of schemas",
        )),
    }
}

/// Conjunction of two folded schemas. `(A1|A2) & B` becomes `(A1&B)|(A2&B)`, which also
/// holds for `oneOf` (exactly one `Ai&B` matches iff `B` and exactly one `Ai` match), and
/// `(A1|A2) & (B1|B2)` becomes `(A1&B1)|(A1&B2)|(A2&B1)|(A2&B2)`.
fn merge(cx: &mut FlatCx, a: Flat, b: Flat, kw: &str, ptr: &str) -> Res<Flat> {
    let mut mm = |x: &Obj, y: &Obj| -> Res<Obj> {
        cx.budget.spend(map_weight(x) + map_weight(y), kw, ptr)?;
        merge_maps(x, y, ptr)
    };
    let out = match (a, b) {
        (Flat::Plain(x), Flat::Plain(y)) => Flat::Plain(mm(&x, &y)?),
        (Flat::Plain(x), Flat::Any(v)) | (Flat::Any(v), Flat::Plain(x)) => {
            Flat::Any(dedup(v.iter().map(|y| mm(y, &x)).collect::<Res<_>>()?))
        }
        (Flat::Plain(x), Flat::One(v)) | (Flat::One(v), Flat::Plain(x)) => {
            Flat::One(v.iter().map(|y| mm(y, &x)).collect::<Res<_>>()?)
        }
        (Flat::One(v), other) | (other, Flat::One(v)) => {
            let o = other.into_obj();
            Flat::One(v.iter().map(|y| mm(y, &o)).collect::<Res<_>>()?)
        }
        (Flat::Any(v), Flat::Any(w)) => {
            check_alts(v.len().saturating_mul(w.len()), kw, ptr)?;
            let mut out = Vec::new();
            for y in &v {
                for z in &w {
                    match mm(y, z) {
                        Ok(m) => out.push(m),
                        // a combination that matches nothing adds nothing to the union
                        Err(SchemaError::Unsatisfiable { .. }) => {}
                        Err(e) => return Err(e),
                    }
                }
            }
            if out.is_empty() {
                return Err(SchemaError::unsat(
                    kw,
                    ptr,
                    "no combination of the alternatives can match",
                ));
            }
            Flat::Any(dedup(out))
        }
    };
    Ok(out)
}

fn is_trivial(v: &Value) -> bool {
    match v {
        Value::Bool(true) => true,
        Value::Object(m) => m.keys().all(|k| !is_constraining(k)),
        _ => false,
    }
}

/// Schema for "both `a` and `b`" (None = unconstrained).
fn both(a: Option<&Value>, b: Option<&Value>) -> Option<Value> {
    match (a, b) {
        (None, None) => None,
        (Some(x), None) | (None, Some(x)) => Some(x.clone()),
        (Some(x), Some(y)) => Some(if x == &Value::Bool(false) || y == &Value::Bool(false) {
            Value::Bool(false)
        } else if is_trivial(x) || x == y {
            y.clone()
        } else if is_trivial(y) {
            x.clone()
        } else {
            serde_json::json!({ "allOf": [x, y] })
        }),
    }
}

fn type_names<'v>(v: &'v Value, ptr: &str) -> Res<Vec<&'v str>> {
    match v {
        Value::String(s) => Ok(vec![s.as_str()]),
        Value::Array(a) => a
            .iter()
            .map(|t| {
                t.as_str().ok_or_else(|| {
                    SchemaError::invalid("type", ptr, "must be a string or an array of strings")
                })
            })
            .collect(),
        _ => Err(SchemaError::invalid(
            "type",
            ptr,
            "must be a string or an array of strings",
        )),
    }
}

fn num_cmp(a: &Value, b: &Value) -> Option<std::cmp::Ordering> {
    let x = Decimal::from_number(a.as_number()?)?;
    let y = Decimal::from_number(b.as_number()?)?;
    Some(x.cmp(&y))
}

fn combine(k: &str, a: &Value, b: &Value, ptr: &str) -> Res<Value> {
    if a == b || ANNOTATIONS.contains(&k) || !is_constraining(k) {
        return Ok(a.clone());
    }
    let cannot = || {
        Err(SchemaError::unsupported(
            k,
            ptr,
            "allOf/$ref parts with different values of this keyword cannot be combined",
        ))
    };
    match k {
        "type" => {
            let (x, y) = (type_names(a, ptr)?, type_names(b, ptr)?);
            let mut out: Vec<&str> = Vec::new();
            for t in &x {
                for u in &y {
                    let r = match (*t, *u) {
                        (t, u) if t == u => Some(t),
                        ("integer", "number") | ("number", "integer") => Some("integer"),
                        _ => None,
                    };
                    if let Some(r) = r {
                        if !out.contains(&r) {
                            out.push(r);
                        }
                    }
                }
            }
            match out.len() {
                0 => Err(SchemaError::unsat(
                    "type",
                    ptr,
                    "allOf parts require incompatible types",
                )),
                1 => Ok(Value::String(out[0].to_string())),
                _ => Ok(Value::Array(
                    out.into_iter().map(|s| Value::String(s.into())).collect(),
                )),
            }
        }
        "enum" => {
            let (Some(x), Some(y)) = (a.as_array(), b.as_array()) else {
                return Err(SchemaError::invalid("enum", ptr, "must be an array"));
            };
            let out: Vec<Value> = x
                .iter()
                .filter(|v| y.iter().any(|w| json_eq(v, w)))
                .cloned()
                .collect();
            if out.is_empty() {
                Err(SchemaError::unsat(
                    "enum",
                    ptr,
                    "allOf parts share no enum value",
                ))
            } else {
                Ok(Value::Array(out))
            }
        }
        "const" => {
            if json_eq(a, b) {
                Ok(a.clone())
            } else {
                Err(SchemaError::unsat(
                    "const",
                    ptr,
                    "allOf parts require different constants",
                ))
            }
        }
        "minimum" | "exclusiveMinimum" | "minLength" | "minItems" | "minProperties" => {
            match num_cmp(a, b) {
                Some(o) => Ok(if o.is_ge() { a.clone() } else { b.clone() }),
                None => cannot(),
            }
        }
        "maximum" | "exclusiveMaximum" | "maxLength" | "maxItems" | "maxProperties" => {
            match num_cmp(a, b) {
                Some(o) => Ok(if o.is_le() { a.clone() } else { b.clone() }),
                None => cannot(),
            }
        }
        "uniqueItems" => Ok(Value::Bool(
            a.as_bool().unwrap_or(false) || b.as_bool().unwrap_or(false),
        )),
        "items" | "additionalItems" if !a.is_array() && !b.is_array() => {
            Ok(both(Some(a), Some(b)).unwrap_or(Value::Bool(true)))
        }
        "anyOf" | "oneOf" | "allOf" => {
            // keep both constraints; they are resolved when this schema is converted
            Ok(a.clone())
        }
        _ => cannot(),
    }
}

/// Conjunction of two plain schemas, keyword by keyword.
pub(crate) fn merge_maps(a: &Obj, b: &Obj, ptr: &str) -> Res<Obj> {
    let mut out = a.clone();
    let mut extra_all: Vec<Value> = Vec::new();
    for (k, vb) in b {
        if matches!(
            k.as_str(),
            "properties" | "additionalProperties" | "required"
        ) {
            continue;
        }
        match out.get(k) {
            None => {
                out.insert(k.clone(), vb.clone());
            }
            Some(va) => {
                if matches!(k.as_str(), "anyOf" | "oneOf" | "allOf") && va != vb {
                    let mut m = Obj::new();
                    m.insert(k.clone(), vb.clone());
                    extra_all.push(Value::Object(m));
                    continue;
                }
                let v = combine(k, va, vb, ptr)?;
                out.insert(k.clone(), v);
            }
        }
    }
    if !extra_all.is_empty() {
        let mut all = match out.remove("allOf") {
            Some(Value::Array(v)) => v,
            Some(other) => vec![serde_json::json!({ "allOf": other })],
            None => Vec::new(),
        };
        all.extend(extra_all);
        out.insert("allOf".into(), Value::Array(all));
    }
    // object keywords: a property declared on one side only must still satisfy the other
    // side's additionalProperties
    let props = |m: &Obj| -> Res<Option<Obj>> {
        match m.get("properties") {
            None => Ok(None),
            Some(Value::Object(p)) => Ok(Some(p.clone())),
            Some(_) => Err(SchemaError::invalid("properties", ptr, "must be an object")),
        }
    };
    let (pa, pb) = (props(a)?, props(b)?);
    let (apa, apb) = (a.get("additionalProperties"), b.get("additionalProperties"));
    if pa.is_some() || pb.is_some() {
        let mut names: Vec<String> = Vec::new();
        for p in [&pa, &pb].into_iter().flatten() {
            for k in p.keys() {
                if !names.contains(k) {
                    names.push(k.clone());
                }
            }
        }
        let mut merged = Obj::new();
        for n in names {
            let sa = pa.as_ref().and_then(|p| p.get(&n)).or(apa);
            let sb = pb.as_ref().and_then(|p| p.get(&n)).or(apb);
            if let Some(v) = both(sa, sb) {
                merged.insert(n, v);
            }
        }
        out.insert("properties".into(), Value::Object(merged));
    }
    match both(apa, apb) {
        Some(v) => {
            out.insert("additionalProperties".into(), v);
        }
        None => {
            out.remove("additionalProperties");
        }
    }
    let mut req: Vec<Value> = Vec::new();
    for m in [a, b] {
        match m.get("required") {
            None => {}
            Some(Value::Array(r)) => {
                for x in r {
                    if !req.contains(x) {
                        req.push(x.clone());
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
    }
    if !req.is_empty() {
        out.insert("required".into(), Value::Array(req));
    }
    Ok(out)
}

// ---- semantic analysis for oneOf --------------------------------------------------------

pub(crate) const K_NULL: u8 = 1;
pub(crate) const K_BOOL: u8 = 2;
pub(crate) const K_INT: u8 = 4;
pub(crate) const K_FRAC: u8 = 8;
pub(crate) const K_STR: u8 = 16;
pub(crate) const K_ARR: u8 = 32;
pub(crate) const K_OBJ: u8 = 64;
pub(crate) const K_ALL: u8 = 127;

pub(crate) fn kind_of(v: &Value) -> u8 {
    match v {
        Value::Null => K_NULL,
        Value::Bool(_) => K_BOOL,
        Value::Number(n) => {
            if n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0) {
                K_INT
            } else {
                K_FRAC
            }
        }
        Value::String(_) => K_STR,
        Value::Array(_) => K_ARR,
        Value::Object(_) => K_OBJ,
    }
}

pub(crate) fn type_mask(t: &str) -> u8 {
    match t {
        "null" => K_NULL,
        "boolean" => K_BOOL,
        "integer" => K_INT,
        "number" => K_INT | K_FRAC,
        "string" => K_STR,
        "array" => K_ARR,
        "object" => K_OBJ,
        _ => K_ALL,
    }
}

/// Value comparisons (or copies of references) per unit of work.
const COMPARISONS_PER_WORK: u64 = 32;

/// How deep the `oneOf` analysis follows subschemas and `$ref`s (results are remembered per
/// node and depth, so this bounds its work linearly).
const ANALYSIS_DEPTH: usize = 32;

/// Follows a chain of `$ref`s.
fn deref<'v>(root: &'v Value, mut s: &'v Value) -> &'v Value {
    for _ in 0..ANALYSIS_DEPTH {
        match s.get("$ref").and_then(Value::as_str) {
            Some(r) => match resolve_ref(root, r, "#") {
                Ok((t, _)) => s = t,
                Err(_) => return s,
            },
            None => return s,
        }
    }
    s
}

/// The semantic checks for `oneOf`, with their results remembered per schema node (and
/// depth), so that shared subschemas are analysed once.
pub(crate) struct Analysis<'v, 'b> {
    root: &'v Value,
    budget: &'b mut Budget,
    /// (address of a schema node, depth) -> kinds; every node lives in `root` or in the
    /// `oneOf` being checked, both of which outlive the analysis
    memo: HashMap<(usize, usize), u8>,
}

impl<'v, 'b> Analysis<'v, 'b> {
    pub fn new(root: &'v Value, budget: &'b mut Budget) -> Self {
        Analysis {
            root,
            budget,
            memo: HashMap::new(),
        }
    }

    /// True once the work budget ran out (the answers given since are conservative).
    pub fn exhausted(&self) -> bool {
        self.budget.exhausted()
    }

    /// Over-approximation of the kinds of values a schema accepts.
    pub fn kinds(&mut self, s: &Value, depth: usize) -> u8 {
        if depth > ANALYSIS_DEPTH {
            return K_ALL;
        }
        let key = (s as *const Value as usize, depth);
        if let Some(&k) = self.memo.get(&key) {
            return k;
        }
        if !self.budget.try_spend(1) {
            return K_ALL;
        }
        let k = self.kinds_uncached(s, depth);
        self.memo.insert(key, k);
        k
    }

    fn kinds_uncached(&mut self, s: &Value, depth: usize) -> u8 {
        let root = self.root;
        let m = match s {
            Value::Bool(false) => return 0,
            Value::Object(m) => m,
            _ => return K_ALL,
        };
        let mut k = K_ALL;
        if let Some(r) = m.get("$ref").and_then(Value::as_str) {
            if let Ok((t, _)) = resolve_ref(root, r, "#") {
                k &= self.kinds(t, depth + 1);
            }
        }
        match m.get("type") {
            Some(Value::String(t)) => k &= type_mask(t),
            Some(Value::Array(a)) => {
                k &= a
                    .iter()
                    .filter_map(Value::as_str)
                    .fold(0, |acc, t| acc | type_mask(t))
            }
            _ => {}
        }
        if let Some(c) = m.get("const") {
            k &= kind_of(c);
        }
        if let Some(Value::Array(e)) = m.get("enum") {
            self.budget.try_spend(e.len() as u64);
            k &= e.iter().fold(0, |acc, v| acc | kind_of(v));
        }
        for kw in ["anyOf", "oneOf"] {
            if let Some(Value::Array(a)) = m.get(kw) {
                self.budget.try_spend(a.len() as u64);
                let mut u = 0;
                for x in a {
                    u |= self.kinds(x, depth + 1);
                }
                k &= u;
            }
        }
        if let Some(Value::Array(a)) = m.get("allOf") {
            self.budget.try_spend(a.len() as u64);
            for x in a {
                k &= self.kinds(x, depth + 1);
            }
        }
        k
    }

    /// The finite set of values a schema accepts, when it is given by `const`/`enum`.
    fn finite_values<'x>(&mut self, s: &'x Value) -> Option<Vec<&'x Value>>
    where
        'v: 'x,
    {
        let s = deref(self.root, s);
        let m = s.as_object()?;
        let mut vals: Option<Vec<&'x Value>> = m.get("const").map(|c| vec![c]);
        if let Some(Value::Array(e)) = m.get("enum") {
            let cost = e.len() as u64 * vals.as_ref().map_or(1, |v| v.len() as u64);
            if !self.budget.try_spend(cost / COMPARISONS_PER_WORK) {
                return None;
            }
            vals = Some(match vals {
                Some(v) => v
                    .into_iter()
                    .filter(|x| e.iter().any(|y| json_eq(x, y)))
                    .collect(),
                None => e.iter().collect(),
            });
        }
        vals
    }

    /// True when no instance can be valid against both schemas.
    pub fn disjoint(&mut self, a: &Value, b: &Value, depth: usize) -> bool {
        if depth > 4 || !self.budget.try_spend(1) {
            return false;
        }
        let root = self.root;
        let (ka, kb) = (self.kinds(a, 0), self.kinds(b, 0));
        let common = ka & kb;
        if common == 0 {
            return true;
        }
        let (fa, fb) = (self.finite_values(a), self.finite_values(b));
        if let (Some(x), Some(y)) = (&fa, &fb) {
            if !self
                .budget
                .try_spend(x.len() as u64 * y.len() as u64 / COMPARISONS_PER_WORK)
            {
                return false;
            }
            if !x.iter().any(|v| y.iter().any(|w| json_eq(v, w))) {
                return true;
            }
        }
        if let Some(x) = &fa {
            if x.iter().all(|v| kind_of(v) & kb == 0) {
                return true;
            }
        }
        if let Some(y) = &fb {
            if y.iter().all(|v| kind_of(v) & ka == 0) {
                return true;
            }
        }
        if common != K_OBJ {
            return false;
        }
        // a property required on one side and declared on the other with disjoint schemas
        let (ma, mb) = (deref(root, a), deref(root, b));
        for (x, y) in [(ma, mb), (mb, ma)] {
            let req = x.get("required").and_then(Value::as_array);
            let (px, py) = (
                x.get("properties").and_then(Value::as_object),
                y.get("properties").and_then(Value::as_object),
            );
            let (Some(req), Some(px), Some(py)) = (req, px, py) else {
                continue;
            };
            for name in req.iter().filter_map(Value::as_str) {
                if let (Some(sx), Some(sy)) = (px.get(name), py.get(name)) {
                    if self.disjoint(sx, sy, depth + 1) {
                        return true;
                    }
                }
            }
        }
        false
    }
}
