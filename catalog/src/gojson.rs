//! JSON text exactly as Go's `encoding/json` writes it for decoded documents:
//! compact, object keys sorted, numbers formatted as float64, and optional
//! HTML escaping. opm re-encodes every catalog document this way, and the
//! property values it serves are slices of that text.

use serde_json::Value;

/// Encodes `v` like Go's `json.Marshal` of an `interface{}` value.
pub fn encode(v: &Value, escape_html: bool) -> String {
    let mut out = String::new();
    write_value(&mut out, v, escape_html);
    out
}

fn write_value(out: &mut String, v: &Value, html: bool) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => write_number(out, n),
        Value::String(s) => write_string(out, s, html),
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, x, html);
            }
            out.push(']');
        }
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, k, html);
                out.push(':');
                write_value(out, &m[k], html);
            }
            out.push('}');
        }
    }
}

fn write_number(out: &mut String, n: &serde_json::Number) {
    // Go decodes every JSON number into a float64.
    let f = n.as_f64().unwrap_or(0.0);
    out.push_str(&format_float(f));
}

/// Go's float64 formatting in encoding/json.
pub fn format_float(f: f64) -> String {
    let abs = f.abs();
    if abs != 0.0 && !(1e-6..1e21).contains(&abs) {
        let s = format!("{f:e}");
        // Rust: 1e21, 1.5e-7; Go: 1e+21, 1.5e-07 cleaned to 1.5e-7.
        match s.split_once('e') {
            Some((m, e)) if !e.starts_with('-') => {
                let e = if e.len() < 2 {
                    format!("0{e}")
                } else {
                    e.to_string()
                };
                format!("{m}e+{e}")
            }
            _ => s,
        }
    } else {
        format!("{f}")
    }
}

fn write_string(out: &mut String, s: &str, html: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '<' | '>' | '&' if html => out.push_str(&format!("\\u{:04x}", c as u32)),
            '\u{2028}' | '\u{2029}' => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Applies Go's HTML escaping to JSON text produced by serde_json (the
/// characters can only occur inside strings).
pub fn escape_html_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    escape_html_into(s, &mut out);
    out
}

/// [`escape_html_text`] appending to `out`.
pub fn escape_html_into(s: &str, out: &mut String) {
    for c in s.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorts_keys_and_formats_numbers_like_go() {
        let v: Value =
            serde_json::from_str(r#"{"b":1.0,"a":[1e21,0.0000001,2.5,-3],"c":"<&>"}"#).unwrap();
        assert_eq!(
            encode(&v, false),
            r#"{"a":[1e+21,1e-7,2.5,-3],"b":1,"c":"<&>"}"#
        );
        assert_eq!(
            encode(&v, true),
            r#"{"a":[1e+21,1e-7,2.5,-3],"b":1,"c":"\u003c\u0026\u003e"}"#
        );
    }

    #[test]
    fn escapes_controls() {
        let v = Value::String("a\u{1}\n\u{8}\u{2028}".into());
        assert_eq!(encode(&v, false), r#""a\u0001\n\b\u2028""#);
    }
}
