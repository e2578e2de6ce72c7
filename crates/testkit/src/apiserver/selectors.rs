//! Label and field selectors.
//!
//! Mimics kube-apiserver's selectors from k8s.io/apimachinery: `pkg/labels` (the `labelSelector`
//! query-string syntax and its matching rules), `metav1.LabelSelectorAsSelector` (the object form
//! used by webhooks' `namespaceSelector`/`objectSelector`), and `pkg/fields` together with the
//! per-kind field label conversions (the `fieldSelector` query string).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde_json::Value;

// ---------------------------------------------------------------------------------------------
// Validation of label keys and values (k8s.io/apimachinery/pkg/util/validation).
// ---------------------------------------------------------------------------------------------

const LABEL_VALUE_MAX_LEN: usize = 63;
const DNS1123_SUBDOMAIN_MAX_LEN: usize = 253;

const NAME_CHARS_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must \
     start and end with an alphanumeric character (e.g. 'MyName', or 'my.name', or '123-abc', \
     regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`, the shape of a label value and of a key's name part
/// (apart from the empty string, which the callers handle).
fn is_label_name_shape(s: &str) -> bool {
    let bytes = s.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && bytes
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

/// Kubernetes' `IsDNS1123Subdomain`: at most 253 characters of dot-separated lowercase RFC 1123
/// labels (`[a-z0-9]([-a-z0-9]*[a-z0-9])?`).
pub(crate) fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= DNS1123_SUBDOMAIN_MAX_LEN
        && s.split('.').all(|label| {
            let b = label.as_bytes();
            match (b.first(), b.last()) {
                (Some(first), Some(last)) => {
                    (first.is_ascii_lowercase() || first.is_ascii_digit())
                        && (last.is_ascii_lowercase() || last.is_ascii_digit())
                        && b.iter()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                }
                _ => false,
            }
        })
}

/// Kubernetes' `IsQualifiedName`, which label keys must pass: an optional DNS-1123 subdomain
/// prefix and `/`, then a name of at most 63 characters.
fn qualified_name_errors(key: &str) -> Vec<String> {
    let parts: Vec<&str> = key.split('/').collect();
    let (prefix, name) = match parts.as_slice() {
        [name] => (None, *name),
        [prefix, name] => (Some(*prefix), *name),
        _ => {
            return vec![format!(
                "a qualified name {NAME_CHARS_MSG} with an optional DNS subdomain prefix and '/' \
                 (e.g. 'example.com/MyName')"
            )];
        }
    };
    let mut errors = Vec::new();
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            errors.push("prefix part must be non-empty".to_owned());
        } else if !is_dns1123_subdomain(prefix) {
            errors.push(
                "prefix part a lowercase RFC 1123 subdomain must consist of lower case \
                 alphanumeric characters, '-' or '.', must start and end with an alphanumeric \
                 character and be at most 253 characters long (e.g. 'example.com')"
                    .to_owned(),
            );
        }
    }
    if name.is_empty() {
        errors.push("name part must be non-empty".to_owned());
    } else {
        if name.len() > LABEL_VALUE_MAX_LEN {
            errors.push(format!(
                "name part must be no more than {LABEL_VALUE_MAX_LEN} characters"
            ));
        }
        if !is_label_name_shape(name) {
            errors.push(format!("name part {NAME_CHARS_MSG}"));
        }
    }
    errors
}

/// Kubernetes' `IsValidLabelValue`: empty, or at most 63 characters shaped like a name.
fn label_value_errors(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > LABEL_VALUE_MAX_LEN {
        errors.push(format!(
            "must be no more than {LABEL_VALUE_MAX_LEN} characters"
        ));
    }
    if !value.is_empty() && !is_label_name_shape(value) {
        errors.push(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', \
             '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue', \
             or 'my_value', or '12345', regex used for validation is \
             '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
                .to_owned(),
        );
    }
    errors
}

/// Formats like apimachinery's `field.Invalid(path, value, detail)`.
fn invalid(path: &str, value: &str, detail: &str) -> String {
    format!("{path}: Invalid value: {value:?}: {detail}")
}

// ---------------------------------------------------------------------------------------------
// Label selectors (k8s.io/apimachinery/pkg/labels).
// ---------------------------------------------------------------------------------------------

/// The operators of a label requirement (`k8s.io/apimachinery/pkg/selection`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Operator {
    /// `=` or `==` (apimachinery keeps them apart only for printing).
    Equals,
    DoubleEquals,
    NotEquals,
    In,
    NotIn,
    Exists,
    DoesNotExist,
    /// `>`: the query-string syntax also has integer comparisons (not the object form).
    GreaterThan,
    LessThan,
}

/// One requirement of a selector: `key op values`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Requirement {
    key: String,
    operator: Operator,
    values: BTreeSet<String>,
}

impl Requirement {
    /// Mimics `labels.NewRequirement`: validates the key, the values and their count for the
    /// operator.
    fn new(key: &str, operator: Operator, values: Vec<String>) -> Result<Self, String> {
        let mut errors: Vec<String> = qualified_name_errors(key)
            .iter()
            .map(|e| invalid("key", key, e))
            .collect();
        let count = values.len();
        match operator {
            Operator::In | Operator::NotIn if count == 0 => errors.push(
                "values: Invalid value: []: for 'in', 'notin' operators, values set can't be empty"
                    .to_owned(),
            ),
            Operator::Equals | Operator::DoubleEquals | Operator::NotEquals if count != 1 => errors
                .push(format!(
                    "values: Invalid value: {values:?}: exact-match compatibility requires one \
                     single value"
                )),
            Operator::Exists | Operator::DoesNotExist if count != 0 => errors.push(format!(
                "values: Invalid value: {values:?}: values set must be empty for exists and does \
                 not exist"
            )),
            Operator::GreaterThan | Operator::LessThan => {
                if count != 1 {
                    errors.push(format!(
                        "values: Invalid value: {values:?}: for 'Gt', 'Lt' operators, exactly one \
                         value is required"
                    ));
                }
                for (i, v) in values.iter().enumerate() {
                    if v.parse::<i64>().is_err() {
                        errors.push(invalid(
                            &format!("values[{i}]"),
                            v,
                            "for 'Gt', 'Lt' operators, the value must be an integer",
                        ));
                    }
                }
            }
            _ => {}
        }
        for (i, v) in values.iter().enumerate() {
            for e in label_value_errors(v) {
                errors.push(invalid(&format!("values[{i}]"), v, &e));
            }
        }
        if !errors.is_empty() {
            return Err(errors.join(", "));
        }
        Ok(Requirement {
            key: key.to_owned(),
            operator,
            values: values.into_iter().collect(),
        })
    }

    /// Mimics `Requirement.Matches`: `!=` and `notin` match objects without the label; `>`
    /// and `<` need the label to hold an integer.
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key);
        match self.operator {
            Operator::Equals | Operator::DoubleEquals | Operator::In => {
                value.is_some_and(|v| self.values.contains(v))
            }
            Operator::NotEquals | Operator::NotIn => value.is_none_or(|v| !self.values.contains(v)),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
            Operator::GreaterThan | Operator::LessThan => {
                let Some(actual) = value.and_then(|v| v.parse::<i64>().ok()) else {
                    return false;
                };
                // Validated at construction: exactly one integer value.
                let Some(bound) = self
                    .values
                    .iter()
                    .next()
                    .and_then(|v| v.parse::<i64>().ok())
                else {
                    return false;
                };
                if self.operator == Operator::GreaterThan {
                    actual > bound
                } else {
                    actual < bound
                }
            }
        }
    }
}

impl fmt::Display for Requirement {
    /// The query-string form, as `Requirement.String()` prints it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let values = || self.values.iter().cloned().collect::<Vec<_>>().join(",");
        match self.operator {
            Operator::Equals => write!(f, "{}={}", self.key, values()),
            Operator::DoubleEquals => write!(f, "{}=={}", self.key, values()),
            Operator::NotEquals => write!(f, "{}!={}", self.key, values()),
            Operator::In => write!(f, "{} in ({})", self.key, values()),
            Operator::NotIn => write!(f, "{} notin ({})", self.key, values()),
            Operator::Exists => write!(f, "{}", self.key),
            Operator::DoesNotExist => write!(f, "!{}", self.key),
            Operator::GreaterThan => write!(f, "{}>{}", self.key, values()),
            Operator::LessThan => write!(f, "{}<{}", self.key, values()),
        }
    }
}

/// A label selector: the AND of its requirements; no requirements select everything.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

/// Tokens of the query-string syntax (apimachinery's `labels.Lexer`).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    /// A run of characters that are neither whitespace nor special symbols. `in` and `notin`
    /// are identifiers too except where an operator is expected, as in apimachinery, where
    /// they are keywords only in the key-and-operator context.
    Ident(String),
    Comma,
    Equals,
    DoubleEquals,
    NotEquals,
    Bang,
    Open,
    Close,
    Greater,
    Less,
    End,
}

impl Token {
    /// The literal, as apimachinery's errors quote it.
    fn literal(&self) -> &str {
        match self {
            Token::Ident(s) => s,
            Token::Comma => ",",
            Token::Equals => "=",
            Token::DoubleEquals => "==",
            Token::NotEquals => "!=",
            Token::Bang => "!",
            Token::Open => "(",
            Token::Close => ")",
            Token::Greater => ">",
            Token::Less => "<",
            Token::End => "",
        }
    }
}

fn is_special(c: char) -> bool {
    matches!(c, '=' | '!' | '(' | ')' | ',' | '>' | '<')
}

/// apimachinery's `isWhitespace`.
fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r' | '\n')
}

/// Splits the query string into tokens. Special symbols are read greedily while they still form
/// a known symbol, so `==` and `!=` are single tokens but `=(` is two.
fn tokenize(s: &str) -> Vec<Token> {
    let mut tokens = Vec::new();
    let mut chars = s.chars().peekable();
    while let Some(&c) = chars.peek() {
        if is_space(c) {
            chars.next();
        } else if is_special(c) {
            chars.next();
            let token = match c {
                '=' if chars.next_if_eq(&'=').is_some() => Token::DoubleEquals,
                '=' => Token::Equals,
                '!' if chars.next_if_eq(&'=').is_some() => Token::NotEquals,
                '!' => Token::Bang,
                '(' => Token::Open,
                ')' => Token::Close,
                ',' => Token::Comma,
                '>' => Token::Greater,
                _ => Token::Less,
            };
            tokens.push(token);
        } else {
            let mut ident = String::new();
            while let Some(c) = chars.next_if(|&c| !is_space(c) && !is_special(c)) {
                ident.push(c);
            }
            tokens.push(Token::Ident(ident));
        }
    }
    tokens.push(Token::End);
    tokens
}

/// A recursive-descent parser over the tokens, accepting the grammar of apimachinery's
/// `labels.Parser` and reporting errors in its words.
struct Parser {
    tokens: Vec<Token>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> &Token {
        self.tokens.get(self.pos).unwrap_or(&Token::End)
    }

    fn next(&mut self) -> Token {
        let token = self.peek().clone();
        if self.pos < self.tokens.len() {
            self.pos += 1;
        }
        token
    }

    /// `selector := "" | requirement ("," requirement)*`
    fn parse(&mut self) -> Result<Vec<Requirement>, String> {
        let mut requirements = Vec::new();
        loop {
            match self.peek() {
                Token::End => return Ok(requirements),
                Token::Ident(_) | Token::Bang => {}
                other => {
                    return Err(format!(
                        "found '{}', expected: !, identifier, or 'end of string'",
                        other.literal()
                    ));
                }
            }
            let requirement = self
                .requirement()
                .map_err(|e| format!("unable to parse requirement: {e}"))?;
            requirements.push(requirement);
            match self.next() {
                Token::End => return Ok(requirements),
                Token::Comma => match self.peek() {
                    Token::Ident(_) | Token::Bang => {}
                    other => {
                        return Err(format!(
                            "found '{}', expected: identifier after ','",
                            other.literal()
                        ));
                    }
                },
                other => {
                    return Err(format!(
                        "found '{}', expected: ',' or 'end of string'",
                        other.literal()
                    ));
                }
            }
        }
    }

    /// `requirement := "!" key | key | key op value | key ("in"|"notin") "(" values ")"`
    fn requirement(&mut self) -> Result<Requirement, String> {
        let negated = self.peek() == &Token::Bang;
        if negated {
            self.next();
        }
        let key = match self.next() {
            Token::Ident(key) => key,
            other => {
                return Err(format!("found '{}', expected: identifier", other.literal()));
            }
        };
        if negated {
            return Requirement::new(&key, Operator::DoesNotExist, Vec::new());
        }
        if matches!(self.peek(), Token::End | Token::Comma) {
            return Requirement::new(&key, Operator::Exists, Vec::new());
        }
        let operator = match self.next() {
            Token::Equals => Operator::Equals,
            Token::DoubleEquals => Operator::DoubleEquals,
            Token::NotEquals => Operator::NotEquals,
            Token::Greater => Operator::GreaterThan,
            Token::Less => Operator::LessThan,
            Token::Ident(word) if word == "in" => Operator::In,
            Token::Ident(word) if word == "notin" => Operator::NotIn,
            other => {
                return Err(format!(
                    "found '{}', expected: =, !=, ==, in, notin, gt, lt",
                    other.literal()
                ));
            }
        };
        let values = match operator {
            Operator::In | Operator::NotIn => self.value_set()?,
            _ => self.exact_value()?,
        };
        Requirement::new(&key, operator, values)
    }

    /// The value after `=`, `==`, `!=`, `>`, `<`; nothing before `,` or the end means "".
    fn exact_value(&mut self) -> Result<Vec<String>, String> {
        if matches!(self.peek(), Token::End | Token::Comma) {
            return Ok(vec![String::new()]);
        }
        match self.next() {
            Token::Ident(value) => Ok(vec![value]),
            other => Err(format!("found '{}', expected: identifier", other.literal())),
        }
    }

    /// `"(" value? ("," value?)* ")"`: as in apimachinery, an omitted value (`()`, `(a,)`,
    /// `(,a)`, `(a,,b)`) stands for the empty string.
    fn value_set(&mut self) -> Result<Vec<String>, String> {
        match self.next() {
            Token::Open => {}
            other => return Err(format!("found '{}' expected: '('", other.literal())),
        }
        let mut values = Vec::new();
        loop {
            // One (possibly empty) value.
            match self.peek().clone() {
                Token::Ident(value) => {
                    self.next();
                    values.push(value);
                }
                Token::Comma | Token::Close => values.push(String::new()),
                other => {
                    return Err(format!(
                        "found '{}', expected: ',', ')' or identifier",
                        other.literal()
                    ));
                }
            }
            match self.next() {
                Token::Comma => {}
                Token::Close => return Ok(values),
                other => {
                    return Err(format!("found '{}', expected: ',' or ')'", other.literal()));
                }
            }
        }
    }
}

impl LabelSelector {
    /// The selector that matches every object (`labels.Everything()`).
    pub fn everything() -> Self {
        LabelSelector::default()
    }

    /// Whether this selector has no requirements, so matches everything.
    pub fn is_everything(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Parses the `labelSelector` query parameter, like `labels.Parse`: comma-separated (AND)
    /// requirements `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a)`, `k`, `!k`, and the
    /// integer comparisons `k>1`, `k<1`; whitespace between tokens is ignored and an empty
    /// string selects everything.
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut parser = Parser {
            tokens: tokenize(s),
            pos: 0,
        };
        let requirements = parser.parse()?;
        Ok(LabelSelector { requirements })
    }

    /// Converts a `metav1.LabelSelector` object, like `metav1.LabelSelectorAsSelector`:
    /// `matchLabels` entries become `=` requirements, `matchExpressions` use the operators `In`,
    /// `NotIn` (non-empty `values`), `Exists` and `DoesNotExist` (no `values`).
    ///
    /// An absent (null) selector selects everything here: `LabelSelectorAsSelector(nil)` is
    /// `Nothing()`, but webhooks' `namespaceSelector` and `objectSelector` default to `{}`, and
    /// those are what this serves.
    pub fn from_object(v: &Value) -> Result<Self, String> {
        let object = match v {
            Value::Null => return Ok(Self::everything()),
            Value::Object(object) => object,
            other => return Err(format!("label selector must be an object, got {other}")),
        };
        let mut requirements = Vec::new();
        match object.get("matchLabels") {
            None | Some(Value::Null) => {}
            Some(Value::Object(labels)) => {
                for (key, value) in labels {
                    let Value::String(value) = value else {
                        return Err(format!(
                            "matchLabels[{key:?}] must be a string, got {value}"
                        ));
                    };
                    requirements.push(Requirement::new(
                        key,
                        Operator::Equals,
                        vec![value.clone()],
                    )?);
                }
            }
            Some(other) => return Err(format!("matchLabels must be an object, got {other}")),
        }
        match object.get("matchExpressions") {
            None | Some(Value::Null) => {}
            Some(Value::Array(expressions)) => {
                for (i, expression) in expressions.iter().enumerate() {
                    requirements.push(
                        expression_requirement(expression)
                            .map_err(|e| format!("matchExpressions[{i}]: {e}"))?,
                    );
                }
            }
            Some(other) => return Err(format!("matchExpressions must be a list, got {other}")),
        }
        Ok(LabelSelector { requirements })
    }

    /// Whether a set of labels satisfies every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }
}

impl fmt::Display for LabelSelector {
    /// The query-string form (requirements in their original order).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

/// One `metav1.LabelSelectorRequirement`.
fn expression_requirement(expression: &Value) -> Result<Requirement, String> {
    let Value::Object(expression) = expression else {
        return Err(format!("must be an object, got {expression}"));
    };
    let key = match expression.get("key") {
        Some(Value::String(key)) => key.as_str(),
        None | Some(Value::Null) => "",
        Some(other) => return Err(format!("key must be a string, got {other}")),
    };
    let operator = match expression.get("operator") {
        Some(Value::String(op)) => match op.as_str() {
            "In" => Operator::In,
            "NotIn" => Operator::NotIn,
            "Exists" => Operator::Exists,
            "DoesNotExist" => Operator::DoesNotExist,
            other => return Err(format!("{other:?} is not a valid label selector operator")),
        },
        None | Some(Value::Null) => {
            return Err("\"\" is not a valid label selector operator".into());
        }
        Some(other) => return Err(format!("operator must be a string, got {other}")),
    };
    let values = match expression.get("values") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(values)) => values
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(s.clone()),
                other => Err(format!("values must be strings, got {other}")),
            })
            .collect::<Result<_, _>>()?,
        Some(other) => return Err(format!("values must be a list, got {other}")),
    };
    Requirement::new(key, operator, values)
}

/// An object's `metadata.labels`; values that are not strings are skipped.
pub fn labels_of(obj: &Value) -> BTreeMap<String, String> {
    obj.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|labels| {
            labels
                .iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// Field selectors (k8s.io/apimachinery/pkg/fields and the field label conversions).
// ---------------------------------------------------------------------------------------------

/// One term of a field selector: `field=value` (or `==`), or `field!=value`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FieldTerm {
    field: String,
    value: String,
    equal: bool,
}

/// A field selector: the AND of its terms; no terms select everything.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FieldSelector {
    terms: Vec<FieldTerm>,
}

/// The fields a kind can be selected by, as the field label conversion functions kube-apiserver
/// registers (`AddFieldLabelConversionsFor*` in pkg/apis/core/v1) or, for kinds without one,
/// `runtime.DefaultMetaV1FieldSelectorConversion` allow.
fn supported_fields(kind: &str) -> &'static [&'static str] {
    match kind {
        "Secret" => &["metadata.name", "metadata.namespace", "type"],
        // Namespaces accept `status.phase` and, being cluster-scoped, not `metadata.namespace`.
        "Namespace" => &["metadata.name", "status.phase"],
        // Other kinds get the default: just the two metadata fields. (Core Events also accept
        // `involvedObject.*`, `reason`, `source`, `type`; nothing here selects by those.)
        _ => &["metadata.name", "metadata.namespace"],
    }
}

/// apimachinery's `fields.UnescapeValue`: `\\`, `\,` and `\=` stand for themselves; any other
/// escape, a trailing `\`, or a bare `,` or `=` is an error.
fn unescape_field_value(s: &str) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e @ ('\\' | ',' | '=')) => out.push(e),
                Some(e) => {
                    return Err(format!(
                        "invalid field selector: invalid escape sequence: \\{e}"
                    ));
                }
                None => return Err("invalid field selector: invalid escape sequence: \\".into()),
            },
            ',' | '=' => {
                return Err(format!(
                    "invalid field selector: unescaped character in value: {c}"
                ));
            }
            c => out.push(c),
        }
    }
    Ok(out)
}

/// Splits at commas not escaped by a backslash (`fields.splitTerms`).
fn split_field_terms(s: &str) -> Vec<&str> {
    let mut terms = Vec::new();
    let mut start = 0;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == ',' {
            terms.push(&s[start..i]);
            start = i + 1;
        }
    }
    terms.push(&s[start..]);
    terms
}

impl FieldSelector {
    /// The selector that matches every object.
    pub fn everything() -> Self {
        FieldSelector::default()
    }

    /// Parses the `fieldSelector` query parameter for objects of `kind`, like `fields.ParseSelector`
    /// followed by the kind's field label conversion: comma-separated `field=value`,
    /// `field==value`, `field!=value`; empty terms are skipped; whitespace is not trimmed (it is
    /// part of the field or value, as in Kubernetes). The field is everything before the first
    /// operator; the value may escape `\`, `,` and `=` with a backslash.
    pub fn parse(s: &str, kind: &str) -> Result<Self, String> {
        let mut terms = Vec::new();
        for part in split_field_terms(s) {
            if part.is_empty() {
                continue;
            }
            let Some((at, op)) = part.char_indices().find_map(|(i, _)| {
                ["!=", "==", "="]
                    .into_iter()
                    .find(|op| part[i..].starts_with(op))
                    .map(|op| (i, op))
            }) else {
                return Err(format!(
                    "invalid selector: '{s}'; can't understand '{part}'"
                ));
            };
            terms.push(FieldTerm {
                field: part[..at].to_owned(),
                value: unescape_field_value(&part[at + op.len()..])?,
                equal: op != "!=",
            });
        }
        // The conversion runs after the whole selector parsed, as kube-apiserver's Transform.
        // Kubernetes words this "field label not supported: X" for kinds with their own
        // conversion function (Secret, Namespace, custom resources) and differently for the
        // default; this uses the former for every kind.
        let supported = supported_fields(kind);
        if let Some(term) = terms
            .iter()
            .find(|t| !supported.contains(&t.field.as_str()))
        {
            return Err(format!("field label not supported: {}", term.field));
        }
        Ok(FieldSelector { terms })
    }

    /// Whether this selector has no terms, so matches everything.
    pub fn is_everything(&self) -> bool {
        self.terms.is_empty()
    }

    /// Whether an object satisfies every term. A missing field reads as "" (so a cluster-scoped
    /// object's `metadata.namespace` is ""), as in the field sets kube-apiserver's registries
    /// build.
    pub fn matches(&self, obj: &Value) -> bool {
        self.terms.iter().all(|term| {
            let pointer = match term.field.as_str() {
                "metadata.name" => "/metadata/name",
                "metadata.namespace" => "/metadata/namespace",
                "type" => "/type",
                "status.phase" => "/status/phase",
                _ => return false,
            };
            let actual = obj.pointer(pointer).and_then(Value::as_str).unwrap_or("");
            (actual == term.value) == term.equal
        })
    }

    /// The name this selector pins, like `RequiresExactMatch("metadata.name")` as
    /// kube-apiserver's RequestInfoFactory uses it to give list and watch requests a name for
    /// authorization: the value of a `metadata.name=X` (or `==`) term, if any, provided X is a
    /// valid path segment name. Other terms may be present too (they only narrow the
    /// selection further).
    pub fn name(&self) -> Option<&str> {
        self.terms
            .iter()
            .find(|t| t.field == "metadata.name" && t.equal)
            .map(|t| t.value.as_str())
            .filter(|name| {
                // `path.IsValidPathSegmentName`.
                !name.is_empty()
                    && *name != "."
                    && *name != ".."
                    && !name.contains('/')
                    && !name.contains('%')
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn sel(s: &str) -> LabelSelector {
        LabelSelector::parse(s).unwrap_or_else(|e| panic!("{s:?} should parse: {e}"))
    }

    #[test]
    fn empty_selector_selects_everything() {
        for s in ["", "   ", "\t\n"] {
            let selector = sel(s);
            assert!(selector.is_everything());
            assert!(selector.matches(&labels(&[])));
            assert!(selector.matches(&labels(&[("a", "b")])));
        }
        assert!(LabelSelector::everything().matches(&labels(&[("x", "y")])));
    }

    #[test]
    fn equality_operators() {
        for s in ["app=web", "app==web", " app = web ", "app  ==  web"] {
            let selector = sel(s);
            assert!(selector.matches(&labels(&[("app", "web")])), "{s}");
            assert!(!selector.matches(&labels(&[("app", "db")])), "{s}");
            assert!(!selector.matches(&labels(&[])), "{s}");
        }
    }

    #[test]
    fn not_equals_matches_missing_label() {
        let selector = sel("app!=web");
        assert!(!selector.matches(&labels(&[("app", "web")])));
        assert!(selector.matches(&labels(&[("app", "db")])));
        // As in Kubernetes: an object without the label satisfies `!=`.
        assert!(selector.matches(&labels(&[("other", "x")])));
    }

    #[test]
    fn in_and_notin() {
        let selector = sel("env in (prod, staging)");
        assert!(selector.matches(&labels(&[("env", "prod")])));
        assert!(selector.matches(&labels(&[("env", "staging")])));
        assert!(!selector.matches(&labels(&[("env", "dev")])));
        assert!(!selector.matches(&labels(&[])));

        let selector = sel("env notin (prod)");
        assert!(!selector.matches(&labels(&[("env", "prod")])));
        assert!(selector.matches(&labels(&[("env", "dev")])));
        // As in Kubernetes: an object without the label satisfies `notin`.
        assert!(selector.matches(&labels(&[])));

        // No space before the parenthesis, and "in" as a key or value is just an identifier.
        assert!(sel("in in(in)").matches(&labels(&[("in", "in")])));
        assert!(sel("notin notin (x)").matches(&labels(&[("notin", "y")])));
    }

    #[test]
    fn omitted_values_in_a_set_are_empty_strings() {
        assert!(sel("a in ()").matches(&labels(&[("a", "")])));
        assert!(sel("a in (x,)").matches(&labels(&[("a", "")])));
        assert!(sel("a in (,x)").matches(&labels(&[("a", "x")])));
        assert!(sel("a in (x,,y)").matches(&labels(&[("a", "")])));
        assert!(!sel("a in (x,y)").matches(&labels(&[("a", "")])));
        // `a=` compares with the empty value.
        assert!(sel("a=").matches(&labels(&[("a", "")])));
        assert!(sel("a=,b").matches(&labels(&[("a", ""), ("b", "1")])));
    }

    #[test]
    fn exists_and_does_not_exist() {
        let selector = sel("app");
        assert!(selector.matches(&labels(&[("app", "")])));
        assert!(!selector.matches(&labels(&[])));

        let selector = sel("!app");
        assert!(!selector.matches(&labels(&[("app", "x")])));
        assert!(selector.matches(&labels(&[("other", "x")])));
        assert!(sel("! app").matches(&labels(&[])));
    }

    #[test]
    fn greater_and_less_than() {
        let selector = sel("replicas>2");
        assert!(selector.matches(&labels(&[("replicas", "3")])));
        assert!(!selector.matches(&labels(&[("replicas", "2")])));
        assert!(!selector.matches(&labels(&[("replicas", "many")])));
        assert!(!selector.matches(&labels(&[])));
        assert!(sel("replicas<2").matches(&labels(&[("replicas", "1")])));
        assert!(LabelSelector::parse("replicas>x").is_err());
    }

    #[test]
    fn requirements_are_anded() {
        let selector = sel("app=web, tier in (front), !canary, env!=dev, team");
        let mut l = labels(&[("app", "web"), ("tier", "front"), ("team", "a")]);
        assert!(selector.matches(&l));
        l.insert("canary".into(), "true".into());
        assert!(!selector.matches(&l));
        l.remove("canary");
        l.insert("env".into(), "dev".into());
        assert!(!selector.matches(&l));
        l.remove("team");
        l.insert("env".into(), "prod".into());
        assert!(!selector.matches(&l));
    }

    #[test]
    fn prefixed_keys() {
        let selector = sel("app.kubernetes.io/name=web,example.com/x");
        assert!(selector.matches(&labels(&[
            ("app.kubernetes.io/name", "web"),
            ("example.com/x", "")
        ])));
        assert_eq!(
            selector.to_string(),
            "app.kubernetes.io/name=web,example.com/x"
        );
    }

    #[test]
    fn invalid_syntax_is_an_error() {
        for s in [
            "a=b,",
            ",a=b",
            "a=b,,c=d",
            "a b",
            "a=b c",
            "a in x",
            "a in (x",
            "a in (x y)",
            "a notin",
            "a=(b)",
            "!a=b",
            "!",
            "a===b",
            "=b",
            "(a)",
            "a >= 1",
            "a in (x)(y)",
        ] {
            let err = LabelSelector::parse(s).expect_err(s);
            assert!(!err.is_empty(), "{s}");
        }
        assert_eq!(
            LabelSelector::parse("a=b,").unwrap_err(),
            "found '', expected: identifier after ','"
        );
        assert_eq!(
            LabelSelector::parse("a b").unwrap_err(),
            "unable to parse requirement: found 'b', expected: =, !=, ==, in, notin, gt, lt"
        );
    }

    #[test]
    fn invalid_keys_and_values_are_errors() {
        let long = "a".repeat(64);
        for s in [
            "-a=b".to_owned(),
            "a-=b".to_owned(),
            "a=b-".to_owned(),
            "a=b@c".to_owned(),
            "a=_b".to_owned(),
            "a/b/c=d".to_owned(),
            "/a=b".to_owned(),
            "a/=b".to_owned(),
            "Example.com/a=b".to_owned(),
            "exa_mple.com/a=b".to_owned(),
            format!("{long}=b"),
            format!("a={long}"),
            format!("a in (x,{long})"),
            "a in (x,-)".to_owned(),
            "a.b@c".to_owned(),
        ] {
            assert!(LabelSelector::parse(&s).is_err(), "{s} should be rejected");
        }
        let err = LabelSelector::parse("a=b@c").unwrap_err();
        assert!(err.contains("values[0]: Invalid value: \"b@c\""), "{err}");
        let err = LabelSelector::parse("-a").unwrap_err();
        assert!(err.contains("key: Invalid value: \"-a\""), "{err}");
        // The boundaries that are still valid.
        let max = "a".repeat(63);
        sel(&format!("{max}={max}"));
        sel(&format!("example.com/{max}=A.b-c_D"));
        sel("a=1");
    }

    #[test]
    fn from_object_with_match_labels_and_expressions() {
        let selector = LabelSelector::from_object(&json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [
                {"key": "env", "operator": "In", "values": ["prod", "staging"]},
                {"key": "tier", "operator": "NotIn", "values": ["db"]},
                {"key": "team", "operator": "Exists"},
                {"key": "canary", "operator": "DoesNotExist", "values": []},
            ],
        }))
        .unwrap();
        let good = labels(&[("app", "web"), ("env", "prod"), ("team", "a")]);
        assert!(selector.matches(&good));
        let mut l = good.clone();
        l.insert("app".into(), "db".into());
        assert!(!selector.matches(&l));
        let mut l = good.clone();
        l.insert("env".into(), "dev".into());
        assert!(!selector.matches(&l));
        let mut l = good.clone();
        l.insert("tier".into(), "db".into());
        assert!(!selector.matches(&l));
        let mut l = good.clone();
        l.remove("team");
        assert!(!selector.matches(&l));
        let mut l = good.clone();
        l.insert("canary".into(), "1".into());
        assert!(!selector.matches(&l));
    }

    #[test]
    fn from_object_empty_or_absent_selects_everything() {
        for v in [
            Value::Null,
            json!({}),
            json!({"matchLabels": {}, "matchExpressions": []}),
            json!({"matchLabels": null}),
        ] {
            let selector = LabelSelector::from_object(&v).unwrap();
            assert!(selector.is_everything(), "{v}");
            assert!(selector.matches(&labels(&[("a", "b")])));
            assert!(selector.matches(&labels(&[])));
        }
    }

    #[test]
    fn from_object_rejects_bad_selectors() {
        for v in [
            json!("app=web"),
            json!({"matchLabels": {"app": 1}}),
            json!({"matchLabels": ["app"]}),
            json!({"matchLabels": {"-bad": "x"}}),
            json!({"matchLabels": {"app": "bad value"}}),
            json!({"matchExpressions": {"key": "a"}}),
            json!({"matchExpressions": [{"key": "a", "operator": "In"}]}),
            json!({"matchExpressions": [{"key": "a", "operator": "In", "values": []}]}),
            json!({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": null}]}),
            json!({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}),
            json!({"matchExpressions": [{"key": "a", "operator": "DoesNotExist", "values": ["x"]}]}),
            json!({"matchExpressions": [{"key": "a", "operator": "in", "values": ["x"]}]}),
            json!({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}),
            json!({"matchExpressions": [{"key": "a"}]}),
            json!({"matchExpressions": [{"operator": "Exists"}]}),
            json!({"matchExpressions": [{"key": "a", "operator": "In", "values": [1]}]}),
            json!({"matchExpressions": ["a"]}),
        ] {
            assert!(
                LabelSelector::from_object(&v).is_err(),
                "{v} should be rejected"
            );
        }
        let err = LabelSelector::from_object(
            &json!({"matchExpressions": [{"key": "a", "operator": "Equals", "values": ["x"]}]}),
        )
        .unwrap_err();
        assert_eq!(
            err,
            "matchExpressions[0]: \"Equals\" is not a valid label selector operator"
        );
    }

    #[test]
    fn labels_of_reads_string_labels() {
        let obj = json!({"metadata": {"labels": {"a": "1", "b": 2, "c": null, "d": ""}}});
        assert_eq!(labels_of(&obj), labels(&[("a", "1"), ("d", "")]));
        assert!(labels_of(&json!({"metadata": {}})).is_empty());
        assert!(labels_of(&json!({"metadata": {"labels": "x"}})).is_empty());
        assert!(labels_of(&json!(null)).is_empty());
    }

    fn secret(namespace: &str, name: &str, type_: &str) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": namespace},
            "type": type_,
        })
    }

    #[test]
    fn field_selector_on_name_and_namespace() {
        let selector =
            FieldSelector::parse("metadata.name=a,metadata.namespace==ns", "ConfigMap").unwrap();
        assert!(selector.matches(&json!({"metadata": {"name": "a", "namespace": "ns"}})));
        assert!(!selector.matches(&json!({"metadata": {"name": "b", "namespace": "ns"}})));
        assert!(!selector.matches(&json!({"metadata": {"name": "a", "namespace": "other"}})));

        let selector = FieldSelector::parse("metadata.name!=a", "ConfigMap").unwrap();
        assert!(!selector.matches(&json!({"metadata": {"name": "a"}})));
        assert!(selector.matches(&json!({"metadata": {"name": "b"}})));
    }

    #[test]
    fn field_selector_cluster_scoped_namespace_is_empty() {
        let webhook = json!({"kind": "MutatingWebhookConfiguration", "metadata": {"name": "w"}});
        let selector =
            FieldSelector::parse("metadata.namespace=", "MutatingWebhookConfiguration").unwrap();
        assert!(selector.matches(&webhook));
        let selector =
            FieldSelector::parse("metadata.namespace!=", "MutatingWebhookConfiguration").unwrap();
        assert!(!selector.matches(&webhook));
    }

    #[test]
    fn field_selector_on_secret_type() {
        let selector = FieldSelector::parse("type=kubernetes.io/tls", "Secret").unwrap();
        assert!(selector.matches(&secret("ns", "s", "kubernetes.io/tls")));
        assert!(!selector.matches(&secret("ns", "s", "Opaque")));
        let selector =
            FieldSelector::parse("type!=Opaque,metadata.namespace=ns", "Secret").unwrap();
        assert!(selector.matches(&secret("ns", "s", "kubernetes.io/tls")));
        assert!(!selector.matches(&secret("ns", "s", "Opaque")));
        assert!(!selector.matches(&secret("other", "s", "kubernetes.io/tls")));
        // `type` is a Secret field only.
        assert_eq!(
            FieldSelector::parse("type=Opaque", "ConfigMap").unwrap_err(),
            "field label not supported: type"
        );
    }

    #[test]
    fn field_selector_namespace_kind() {
        let selector = FieldSelector::parse("status.phase=Active", "Namespace").unwrap();
        assert!(
            selector.matches(&json!({"metadata": {"name": "a"}, "status": {"phase": "Active"}}))
        );
        assert!(!selector.matches(&json!({"metadata": {"name": "a"}})));
        assert!(FieldSelector::parse("metadata.name=a", "Namespace").is_ok());
        assert!(FieldSelector::parse("metadata.namespace=", "Namespace").is_err());
    }

    #[test]
    fn field_selector_unsupported_field() {
        assert_eq!(
            FieldSelector::parse("spec.replicas=1", "Deployment").unwrap_err(),
            "field label not supported: spec.replicas"
        );
        // Whitespace is not trimmed, as in Kubernetes.
        assert_eq!(
            FieldSelector::parse("metadata.name =a", "ConfigMap").unwrap_err(),
            "field label not supported: metadata.name "
        );
    }

    #[test]
    fn field_selector_syntax() {
        let everything = FieldSelector::parse("", "ConfigMap").unwrap();
        assert!(everything.is_everything());
        assert!(everything.matches(&json!({})));
        assert!(FieldSelector::everything().matches(&json!({"metadata": {"name": "x"}})));
        // Empty terms are skipped.
        assert!(FieldSelector::parse(",metadata.name=a,", "ConfigMap").is_ok());
        assert_eq!(
            FieldSelector::parse("metadata.name", "ConfigMap").unwrap_err(),
            "invalid selector: 'metadata.name'; can't understand 'metadata.name'"
        );
        assert!(FieldSelector::parse("metadata.name=a=b", "ConfigMap").is_err());
        assert!(FieldSelector::parse("metadata.name=a\\x", "ConfigMap").is_err());
        assert!(FieldSelector::parse("metadata.name=a\\", "ConfigMap").is_err());
        // Escapes in values.
        let selector = FieldSelector::parse(r"metadata.name=a\,b\=c\\d", "ConfigMap").unwrap();
        assert!(selector.matches(&json!({"metadata": {"name": r"a,b=c\d"}})));
    }

    #[test]
    fn field_selector_name() {
        let name = |s: &str| {
            FieldSelector::parse(s, "ConfigMap")
                .unwrap()
                .name()
                .map(str::to_owned)
        };
        assert_eq!(name("metadata.name=cm"), Some("cm".to_owned()));
        assert_eq!(name("metadata.name==cm"), Some("cm".to_owned()));
        assert_eq!(
            name("metadata.namespace=ns,metadata.name=cm"),
            Some("cm".to_owned())
        );
        assert_eq!(name("metadata.name!=cm"), None);
        assert_eq!(name("metadata.namespace=ns"), None);
        assert_eq!(name(""), None);
        assert_eq!(name("metadata.name="), None);
        assert_eq!(name("metadata.name=.."), None);
    }
}
