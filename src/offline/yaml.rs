//! YAML read as kubectl and helm read it: YAML 1.1 scalars, as sigs.k8s.io/yaml resolves them
//! over its fork of go-yaml v2, then made JSON.
//!
//! A plain scalar (unquoted, not a block) is resolved as go-yaml v2's `resolve` does:
//! - exactly these spellings are booleans: `y Y yes Yes YES true True TRUE on On ON` and
//!   `n N no No NO false False FALSE off Off OFF`; `~ null Null NULL` and nothing are null;
//! - a scalar starting with a digit or a sign is a timestamp when it looks like one (kept as its
//!   text: go-yaml gives an untyped target the string), else an integer as Go's
//!   `strconv.ParseInt(s, 0, 64)` reads it after dropping every `_` (so `0755` is octal 493,
//!   `0x1F` and `0o17` and `0b101` too), else an unsigned one, else a float when it matches
//!   `[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?` (so `08` is the float 8), else `0b`
//!   binary, else a string;
//! - one starting with `.` is a float when Go's `ParseFloat` takes it (`.5`, `.inf`);
//! - anything else is a string.
//!
//! Quoted and block scalars are strings. A tag (`!!str`, `!!int`, `!!float`, `!!bool`,
//! `!!null`) asks for that type and fails as go-yaml does when the text is not one
//! (`!!float` takes an integer); any other tag leaves the text a string.
//!
//! Then the JSON conversion: map keys become strings (an integer in decimal, a float as Go's
//! `FormatFloat(k, 'g', -1, 32)`, a boolean as `true`/`false`; a null or other key is an error),
//! a float that is a whole number is written as an integer (Go's JSON does), and NaN or
//! infinity is an error (Go's JSON has no such number). `<<` merges maps as go-yaml v2 does, and
//! a key given twice keeps its last value (kubectl's non-strict reading; a warning says so).

use std::collections::HashMap;

use granit_parser::{Event, Parser, ScalarStyle, Span, Tag};
use serde_json::{Map, Number, Value};

/// Aliases may not make a document larger than this many nodes (a "billion laughs" stops here).
const MAX_NODES: usize = 4_000_000;

/// A problem in one document, at a line and column of it (1-based).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct YamlError {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

/// One document read.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    pub value: Value,
    /// Keys given twice in one map: (line, key); the last value was kept.
    pub duplicates: Vec<(usize, String)>,
}

/// Reads one YAML document (a stream holding at most one).
pub fn parse(text: &str) -> Result<Document, YamlError> {
    let mut reader = Reader {
        parser: parser(text),
        anchors: HashMap::new(),
        nodes: 0,
        duplicates: Vec::new(),
        path: Vec::new(),
        want: None,
        found: None,
    };
    let value = reader.document()?;
    Ok(Document {
        value,
        duplicates: reader.duplicates,
    })
}

/// The line (1-based) where the node at `path` starts in `text`, a document [`parse`] reads:
/// each segment a map key or a list index. None when there is no such node.
pub fn line_of(text: &str, path: &[String]) -> Option<usize> {
    let mut reader = Reader {
        parser: parser(text),
        anchors: HashMap::new(),
        nodes: 0,
        duplicates: Vec::new(),
        path: Vec::new(),
        want: Some(path.to_vec()),
        found: None,
    };
    let _ = reader.document();
    reader.found
}

fn parser(text: &str) -> Parser<'_, granit_parser::StrInput<'_>> {
    let mut options = granit_parser::Options::default();
    options.emit_comments = false;
    Parser::new_from_str_with_options(text, options)
}

struct Reader<'a> {
    parser: Parser<'a, granit_parser::StrInput<'a>>,
    anchors: HashMap<usize, Value>,
    nodes: usize,
    duplicates: Vec<(usize, String)>,
    /// Where the reader is, and the path [`line_of`] looks for.
    path: Vec<String>,
    want: Option<Vec<String>>,
    found: Option<usize>,
}

fn at(span: &Span, message: impl Into<String>) -> YamlError {
    YamlError {
        line: span.start.line(),
        column: span.start.col() + 1,
        message: message.into(),
    }
}

impl<'a> Reader<'a> {
    fn next(&mut self) -> Result<(Event<'a>, Span), YamlError> {
        match self.parser.next_event() {
            Some(Ok(event)) => Ok(event),
            Some(Err(e)) => Err(YamlError {
                line: e.marker().line(),
                column: e.marker().col() + 1,
                message: e.info(),
            }),
            None => Err(YamlError {
                line: 0,
                column: 0,
                message: "the YAML ends early".into(),
            }),
        }
    }

    fn document(&mut self) -> Result<Value, YamlError> {
        let mut value = Value::Null;
        let mut seen = false;
        loop {
            let (event, span) = self.next()?;
            match event {
                Event::StreamStart | Event::DocumentEnd => {}
                Event::DocumentStart(..) if seen => {
                    return Err(at(&span, "a second document where one was expected"));
                }
                Event::DocumentStart(..) => seen = true,
                Event::StreamEnd => return Ok(value),
                #[allow(unreachable_patterns)]
                Event::Anchor(..) => {}
                _ => value = self.node(event, span)?,
            }
        }
    }

    fn count(&mut self, span: &Span, n: usize) -> Result<(), YamlError> {
        self.nodes = self.nodes.saturating_add(n);
        if self.nodes > MAX_NODES {
            return Err(at(
                span,
                format!(
                    "the document has more than {MAX_NODES} nodes once its aliases are expanded"
                ),
            ));
        }
        Ok(())
    }

    fn note_position(&mut self, span: &Span) {
        if self.found.is_none() && self.want.as_ref() == Some(&self.path) {
            self.found = Some(span.start.line());
        }
    }

    fn node(&mut self, event: Event<'a>, span: Span) -> Result<Value, YamlError> {
        self.note_position(&span);
        self.count(&span, 1)?;
        match event {
            Event::Alias(id) => {
                let value = self
                    .anchors
                    .get(&id)
                    .cloned()
                    .ok_or_else(|| at(&span, "an alias to an anchor not defined before it"))?;
                let size = nodes_in(&value);
                self.count(&span, size)?;
                Ok(value)
            }
            Event::Scalar(text, style, anchor, tag) => {
                let value = scalar(&text, style, tag.as_deref()).map_err(|m| at(&span, m))?;
                self.anchor(anchor, &value);
                Ok(value)
            }
            Event::SequenceStart(_, anchor, _) => {
                let mut items = Vec::new();
                loop {
                    let (event, span) = self.next()?;
                    match event {
                        Event::SequenceEnd => break,
                        #[allow(unreachable_patterns)]
                        Event::Anchor(..) => continue,
                        event => {
                            self.path.push(items.len().to_string());
                            let item = self.node(event, span);
                            self.path.pop();
                            items.push(item?);
                        }
                    }
                }
                let value = Value::Array(items);
                self.anchor(anchor, &value);
                Ok(value)
            }
            Event::MappingStart(_, anchor, _) => {
                let mut map = Map::new();
                loop {
                    let (event, key_span) = self.next()?;
                    let key_event = match event {
                        Event::MappingEnd => break,
                        #[allow(unreachable_patterns)]
                        Event::Anchor(..) => continue,
                        event => event,
                    };
                    let merge = matches!(&key_event,
                        Event::Scalar(text, ScalarStyle::Plain, _, None) if text == "<<");
                    // The key, read with a path no one looks for (a scalar key keeps its
                    // float as a float: sigs.k8s.io/yaml formats it its own way).
                    let key = match &key_event {
                        Event::Scalar(text, style, anchor, tag) => {
                            let key = scalar_key(text, *style, tag.as_deref())
                                .map_err(|m| at(&key_span, m))?;
                            self.anchor(*anchor, &Value::String(key.clone()));
                            Value::String(key)
                        }
                        _ => {
                            let want = self.want.take();
                            let key = self.node(key_event, key_span);
                            self.want = want;
                            key?
                        }
                    };
                    let (event, span) = loop {
                        match self.next()? {
                            #[allow(unreachable_patterns)]
                            (Event::Anchor(..), _) => continue,
                            other => break other,
                        }
                    };
                    if merge {
                        let value = self.node(event, span)?;
                        merge_into(&mut map, value).map_err(|m| at(&key_span, m))?;
                        continue;
                    }
                    let key = key_string(&key).map_err(|m| at(&key_span, m))?;
                    self.path.push(key.clone());
                    let value = self.node(event, span);
                    self.path.pop();
                    let value = value?;
                    if map.insert(key.clone(), value).is_some() {
                        self.duplicates.push((key_span.start.line(), key));
                    }
                }
                let value = Value::Object(map);
                self.anchor(anchor, &value);
                Ok(value)
            }
            _ => Err(at(&span, "an unexpected YAML event")),
        }
    }

    fn anchor(&mut self, id: usize, value: &Value) {
        if id != 0 {
            self.anchors.insert(id, value.clone());
        }
    }
}

fn nodes_in(value: &Value) -> usize {
    match value {
        Value::Array(items) => 1 + items.iter().map(nodes_in).sum::<usize>(),
        Value::Object(map) => 1 + map.values().map(|v| 1 + nodes_in(v)).sum::<usize>(),
        _ => 1,
    }
}

/// `<<: value` in `map`: a map's keys, or each map's of a list (the first given wins), as
/// go-yaml v2 sets them: over what the map has so far.
fn merge_into(map: &mut Map<String, Value>, value: Value) -> Result<(), String> {
    match value {
        Value::Object(merged) => {
            map.extend(merged);
            Ok(())
        }
        Value::Array(items) => {
            for item in items.into_iter().rev() {
                match item {
                    Value::Object(merged) => map.extend(merged),
                    _ => {
                        return Err(
                            "map merge requires map or sequence of maps as the value".into()
                        );
                    }
                }
            }
            Ok(())
        }
        _ => Err("map merge requires map or sequence of maps as the value".into()),
    }
}

/// A map key as sigs.k8s.io/yaml writes it in JSON.
fn key_string(key: &Value) -> Result<String, String> {
    match key {
        Value::String(s) => Ok(s.clone()),
        Value::Bool(b) => Ok(b.to_string()),
        Value::Number(n) if n.is_i64() => Ok(n.to_string()),
        Value::Number(n) if n.is_u64() => Err(format!(
            "the map key {n} is too large an integer for kubectl (quote it to make it a string)"
        )),
        Value::Number(n) => Ok(go_format_g32(n.as_f64().unwrap_or(f64::NAN))),
        Value::Null => Err("a map key is null (quote it to make it a string)".into()),
        Value::Array(_) | Value::Object(_) => {
            Err("a map key is a list or a map, which JSON cannot hold".into())
        }
    }
}

/// A scalar map key as sigs.k8s.io/yaml writes it.
fn scalar_key(text: &str, style: ScalarStyle, tag: Option<&Tag>) -> Result<String, String> {
    let plain_float =
        style == ScalarStyle::Plain && tag.is_none() && matches!(resolve(text), Resolved::Float(_));
    if let (true, Resolved::Float(f)) = (plain_float, resolve(text)) {
        return Ok(go_format_g32(f));
    }
    key_string(&scalar(text, style, tag)?)
}

/// What the scalar `text` is, as go-yaml v2 resolves it and JSON writes it.
fn scalar(text: &str, style: ScalarStyle, tag: Option<&Tag>) -> Result<Value, String> {
    let tag = tag.map(|t| {
        if t.handle() == "tag:yaml.org,2002:" || t.handle() == "!!" {
            format!("!!{}", t.suffix())
        } else {
            format!("{}{}", t.handle(), t.suffix())
        }
    });
    let resolvable = match tag.as_deref() {
        None => style == ScalarStyle::Plain,
        Some("!!str" | "!!bool" | "!!int" | "!!float" | "!!null" | "!!timestamp") => true,
        Some(_) => false,
    };
    if !resolvable {
        return Ok(Value::String(text.to_owned()));
    }
    if tag.as_deref() == Some("!!str") {
        return Ok(Value::String(text.to_owned()));
    }
    let resolved = resolve(text);
    let kind = |v: &Resolved| match v {
        Resolved::Null => "!!null",
        Resolved::Bool(_) => "!!bool",
        Resolved::Int(_) | Resolved::Uint(_) => "!!int",
        Resolved::Float(_) => "!!float",
        Resolved::Str | Resolved::Timestamp => "!!str",
    };
    let resolved = match (tag.as_deref(), resolved) {
        (None, r) => r,
        (Some("!!float"), Resolved::Int(i)) => Resolved::Float(i as f64),
        (Some("!!float"), Resolved::Uint(u)) => Resolved::Float(u as f64),
        (Some("!!timestamp"), r @ Resolved::Timestamp) => r,
        (Some(t), r) if kind(&r) == t => r,
        (Some(t), r) => {
            return Err(format!(
                "cannot decode {} `{text}` as a {t}",
                if matches!(r, Resolved::Timestamp) {
                    "!!timestamp"
                } else {
                    kind(&r)
                }
            ));
        }
    };
    Ok(match resolved {
        Resolved::Null => Value::Null,
        Resolved::Bool(b) => Value::Bool(b),
        Resolved::Int(i) => Value::Number(i.into()),
        Resolved::Uint(u) => Value::Number(u.into()),
        Resolved::Float(f) => json_float(f).ok_or_else(|| {
            format!("`{text}` is not a number JSON can hold (quote it to make it a string)")
        })?,
        Resolved::Str | Resolved::Timestamp => Value::String(text.to_owned()),
    })
}

/// A float as Go's JSON writes it: a whole number within ±1e21 as an integer; None for NaN and
/// infinities.
fn json_float(f: f64) -> Option<Value> {
    if !f.is_finite() {
        return None;
    }
    if f.fract() == 0.0 && f.abs() < 1e21 {
        if f >= i64::MIN as f64 && f < i64::MAX as f64 {
            return Some(Value::Number((f as i64).into()));
        }
        if f >= 0.0 && f < u64::MAX as f64 {
            return Some(Value::Number((f as u64).into()));
        }
    }
    Number::from_f64(f).map(Value::Number)
}

enum Resolved {
    Null,
    Bool(bool),
    Int(i64),
    Uint(u64),
    Float(f64),
    Timestamp,
    Str,
}

/// go-yaml v2's `resolve` of a plain scalar.
fn resolve(text: &str) -> Resolved {
    match text {
        "y" | "Y" | "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => {
            return Resolved::Bool(true);
        }
        "n" | "N" | "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => {
            return Resolved::Bool(false);
        }
        "" | "~" | "null" | "Null" | "NULL" => return Resolved::Null,
        ".nan" | ".NaN" | ".NAN" => return Resolved::Float(f64::NAN),
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => {
            return Resolved::Float(f64::INFINITY);
        }
        "-.inf" | "-.Inf" | "-.INF" => return Resolved::Float(f64::NEG_INFINITY),
        _ => {}
    }
    match text.as_bytes()[0] {
        b'.' => go_parse_float(text).map_or(Resolved::Str, Resolved::Float),
        b'0'..=b'9' | b'+' | b'-' => {
            if is_timestamp(text) {
                return Resolved::Timestamp;
            }
            let plain: String = text.chars().filter(|&c| c != '_').collect();
            if let Some(i) = go_parse_int(&plain) {
                return Resolved::Int(i);
            }
            if let Some(u) = go_parse_uint(&plain) {
                return Resolved::Uint(u);
            }
            // Go's ParseFloat refuses what overflows (Rust's gives infinity).
            if is_yaml_float(&plain)
                && let Ok(f) = plain.parse::<f64>()
                && f.is_finite()
            {
                return Resolved::Float(f);
            }
            if let Some(bits) = plain.strip_prefix("0b") {
                if let Ok(i) = i64::from_str_radix(bits, 2)
                    && !bits.starts_with(['+', '-'])
                {
                    return Resolved::Int(i);
                }
                if let Ok(u) = u64::from_str_radix(bits, 2)
                    && !bits.starts_with(['+', '-'])
                {
                    return Resolved::Uint(u);
                }
            } else if let Some(bits) = plain.strip_prefix("-0b")
                && !bits.starts_with(['+', '-'])
                && let Ok(i) = i64::from_str_radix(&format!("-{bits}"), 2)
            {
                return Resolved::Int(i);
            }
            Resolved::Str
        }
        _ => Resolved::Str,
    }
}

/// `^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`
fn is_yaml_float(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    if matches!(b.first(), Some(b'+' | b'-')) {
        i += 1;
    }
    let digits = |i: &mut usize| {
        let start = *i;
        while *i < b.len() && b[*i].is_ascii_digit() {
            *i += 1;
        }
        *i - start
    };
    if b.get(i) == Some(&b'.') {
        i += 1;
        if digits(&mut i) == 0 {
            return false;
        }
    } else {
        if digits(&mut i) == 0 {
            return false;
        }
        if b.get(i) == Some(&b'.') {
            i += 1;
            digits(&mut i);
        }
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if digits(&mut i) == 0 {
            return false;
        }
    }
    i == b.len()
}

/// Go's `strconv.ParseInt(s, 0, 64)` (underscores already dropped): a sign, then `0x`/`0X` hex,
/// `0o`/`0O` octal, `0b`/`0B` binary, a leading `0` octal, or decimal.
fn go_parse_int(s: &str) -> Option<i64> {
    let (negative, digits) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let magnitude = go_parse_uint(digits)?;
    if negative {
        if magnitude <= i64::MAX as u64 + 1 {
            Some((magnitude as i64).wrapping_neg())
        } else {
            None
        }
    } else {
        i64::try_from(magnitude).ok()
    }
}

/// Go's `strconv.ParseUint(s, 0, 64)`, without a sign.
fn go_parse_uint(s: &str) -> Option<u64> {
    let (radix, digits) = if let Some(rest) = s.strip_prefix("0x").or(s.strip_prefix("0X")) {
        (16, rest)
    } else if let Some(rest) = s.strip_prefix("0o").or(s.strip_prefix("0O")) {
        (8, rest)
    } else if let Some(rest) = s.strip_prefix("0b").or(s.strip_prefix("0B")) {
        (2, rest)
    } else if s.len() > 1 && s.starts_with('0') {
        (8, &s[1..])
    } else {
        (10, s)
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u64::from_str_radix(digits, radix).ok()
}

/// Go's `strconv.ParseFloat(s, 64)` for a scalar starting with `.`: decimal digits with an
/// optional exponent (Go's other spellings cannot start with `.`).
fn go_parse_float(s: &str) -> Option<f64> {
    if is_yaml_float(s) {
        s.parse().ok().filter(|f: &f64| f.is_finite())
    } else {
        None
    }
}

/// go-yaml v2's `parseTimestamp`: four digits and a `-`, then one of its layouts.
fn is_timestamp(s: &str) -> bool {
    let b = s.as_bytes();
    let year = b.iter().take_while(|c| c.is_ascii_digit()).count();
    if year != 4 || b.get(4) != Some(&b'-') {
        return false;
    }
    // 2006-1-2, then optionally [Tt ]15:4:5(.frac)?(Z|±07:00)? (the zone only after T/t).
    let rest = &s[5..];
    let (date, time) = match rest.find(['T', 't', ' ']) {
        Some(i) => (&rest[..i], Some((rest.as_bytes()[i], &rest[i + 1..]))),
        None => (rest, None),
    };
    let Some((month, day)) = date.split_once('-') else {
        return false;
    };
    let number = |s: &str, max: u32| {
        (1..=2).contains(&s.len())
            && s.chars().all(|c| c.is_ascii_digit())
            && s.parse::<u32>().is_ok_and(|n| n >= 1 && n <= max)
    };
    if !number(month, 12) || !number(day, 31) || !valid_day(&s[..4], month, day) {
        return false;
    }
    let Some((separator, time)) = time else {
        return true;
    };
    let (clock, zone) = if separator == b' ' {
        (time, None)
    } else {
        match time.find(['Z', '+', '-']) {
            Some(i) => (&time[..i], Some(&time[i..])),
            None => return false,
        }
    };
    let (hms, fraction) = match clock.split_once('.') {
        Some((hms, f)) => (hms, Some(f)),
        None => (clock, None),
    };
    let parts: Vec<&str> = hms.split(':').collect();
    let in_range = |s: &str, max: u32| {
        (1..=2).contains(&s.len())
            && s.chars().all(|c| c.is_ascii_digit())
            && s.parse::<u32>().is_ok_and(|n| n <= max)
    };
    if parts.len() != 3
        || !in_range(parts[0], 23)
        || !in_range(parts[1], 59)
        || !in_range(parts[2], 59)
    {
        return false;
    }
    if let Some(f) = fraction
        && (f.is_empty() || f.len() > 9 || !f.chars().all(|c| c.is_ascii_digit()))
    {
        return false;
    }
    match zone {
        None => true,
        Some("Z") => true,
        Some(z) => {
            let z = &z[1..];
            let Some((h, m)) = z.split_once(':') else {
                return false;
            };
            h.len() == 2 && m.len() == 2 && in_range(h, 23) && in_range(m, 59)
        }
    }
}

fn valid_day(year: &str, month: &str, day: &str) -> bool {
    let (Ok(y), Ok(m), Ok(d)) = (
        year.parse::<u32>(),
        month.parse::<u32>(),
        day.parse::<u32>(),
    ) else {
        return false;
    };
    let leap = y % 4 == 0 && (y % 100 != 0 || y % 400 == 0);
    let days = match m {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    };
    d <= days
}

/// Go's `strconv.FormatFloat(f, 'g', -1, 32)`: the shortest digits that read back as the same
/// 32-bit float, with an exponent (as `1e+06`) when it is below -4 or at least 6.
fn go_format_g32(f: f64) -> String {
    let f = f as f32;
    if f.is_nan() {
        return ".nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 {
            ".inf".into()
        } else {
            "-.inf".into()
        };
    }
    if f == 0.0 {
        return if f.is_sign_negative() {
            "-0".into()
        } else {
            "0".into()
        };
    }
    // Rust's `{:e}` of an f32 gives its shortest round-trip digits.
    let e = format!("{f:e}");
    let (mantissa, exponent) = e.split_once('e').unwrap_or((&e, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let negative = mantissa.starts_with('-');
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let sign = if negative { "-" } else { "" };
    // Go decides with a precision of 6 when it asked for the shortest digits.
    let eprec = 6;
    if exponent < -4 || exponent >= eprec {
        let mut out = format!("{sign}{}", &digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let (esign, eabs) = if exponent < 0 {
            ('-', -exponent)
        } else {
            ('+', exponent)
        };
        out.push_str(&format!("e{esign}{eabs:02}"));
        return out;
    }
    if exponent < 0 {
        format!("{sign}0.{}{digits}", "0".repeat((-exponent - 1) as usize))
    } else if (exponent + 1) as usize >= digits.len() {
        format!(
            "{sign}{digits}{}",
            "0".repeat(exponent as usize + 1 - digits.len())
        )
    } else {
        let point = exponent as usize + 1;
        format!("{sign}{}.{}", &digits[..point], &digits[point..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(text: &str) -> Value {
        parse(text).unwrap().value
    }

    #[test]
    fn integers_read_as_go_parses_them() {
        let v = read(
            "a: 0755\nb: 0x1F\nc: 0o17\nd: 0b101\ne: 1_000\nf: -0755\ng: +12\nh: 08\ni: 0\nj: 9223372036854775808\n",
        );
        assert_eq!(
            v,
            json!({"a": 493, "b": 31, "c": 15, "d": 5, "e": 1000, "f": -493, "g": 12, "h": 8,
                   "i": 0, "j": 9223372036854775808u64})
        );
    }

    #[test]
    fn booleans_and_nulls_have_exactly_go_yamls_spellings() {
        let v = read("a: yes\nb: Y\nc: on\nd: OFF\ne: yEs\nf: ~\ng:\nh: NULL\ni: nUll\nj: TRUE\n");
        assert_eq!(
            v,
            json!({"a": true, "b": true, "c": true, "d": false, "e": "yEs", "f": null,
                   "g": null, "h": null, "i": "nUll", "j": true})
        );
    }

    #[test]
    fn quoted_and_tagged_scalars() {
        let v =
            read("a: '0755'\nb: \"yes\"\nc: !!str 0755\nd: !!float 1\ne: !custom 12\nf: |\n  x\n");
        assert_eq!(
            v,
            json!({"a": "0755", "b": "yes", "c": "0755", "d": 1, "e": "12", "f": "x\n"})
        );
        assert!(parse("a: !!int yes\n").is_err());
    }

    #[test]
    fn floats_timestamps_and_non_numbers() {
        let v = read(
            "a: 1.5\nb: 1e3\nc: .5\nd: 2001-12-14\ne: 2001-12-14T21:59:43.10-05:00\nf: 1.2.3\n",
        );
        assert_eq!(
            v,
            json!({"a": 1.5, "b": 1000, "c": 0.5, "d": "2001-12-14",
                   "e": "2001-12-14T21:59:43.10-05:00", "f": "1.2.3"})
        );
        let e = parse("a: .inf\n").unwrap_err();
        assert!(e.message.contains("not a number JSON can hold"), "{e:?}");
        assert_eq!(e.line, 1);
    }

    #[test]
    fn map_keys_become_strings_as_sigs_yaml_writes_them() {
        let v = read("on: 1\n0755: 2\n1.5: 3\n1e6: 4\nyes: 5\n");
        assert_eq!(v, json!({"true": 5, "493": 2, "1.5": 3, "1e+06": 4}));
        assert!(parse("~: 1\n").is_err());
    }

    #[test]
    fn duplicates_keep_the_last_and_merges_follow_go_yaml() {
        let d = parse("a: 1\nb: 2\na: 3\n").unwrap();
        assert_eq!(d.value, json!({"a": 3, "b": 2}));
        assert_eq!(d.duplicates, vec![(3, "a".to_owned())]);
        let v = read("base: &b {p: 1, q: 2}\nm:\n  <<: *b\n  q: 3\n");
        assert_eq!(v["m"], json!({"p": 1, "q": 3}));
        // `y` is YAML 1.1's true, as a key too.
        assert_eq!(read("y: 1\n"), json!({"true": 1}));
    }

    #[test]
    fn aliases_cannot_expand_without_bound() {
        let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..9 {
            let p = i - 1;
            text.push_str(&format!(
                "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
            ));
        }
        let e = parse(&text).unwrap_err();
        assert!(e.message.contains("aliases are expanded"), "{e:?}");
    }

    #[test]
    fn lines_of_paths() {
        let text = "spec:\n  volumes:\n    - name: a\n    - name: b\n      configMap:\n        defaultMode: 1.5\n";
        let path: Vec<String> = ["spec", "volumes", "1", "configMap", "defaultMode"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(line_of(text, &path), Some(6));
    }

    #[test]
    fn float_keys_format_as_go_does() {
        for (f, s) in [
            (1.5, "1.5"),
            (1e6, "1e+06"),
            (100000.0, "100000"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.1, "1.1"),
            (-2.5, "-2.5"),
            (123456789.0, "1.2345679e+08"),
        ] {
            assert_eq!(go_format_g32(f), s, "{f}");
        }
    }
}
