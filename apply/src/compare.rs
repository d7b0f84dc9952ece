//! Pure comparison of a desired object with the live one: does applying change anything?
//!
//! The live object carries everything the API server and other managers added (defaults,
//! status, managedFields, ...). Our desired object is *contained* in it when every field we set
//! has the same value there. Lists are compared position by position with equal length (the
//! lists we render are atomic or keyed lists we fully own).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Map, Value};

/// True when applying `desired` over `live` would change nothing we own.
pub fn contained(desired: &Value, live: &Value) -> bool {
    let desired = normalize(desired);
    value_contained(&desired, live)
}

/// Rewrites write-only forms into what the server stores: Secret `stringData` becomes `data`.
fn normalize(desired: &Value) -> Value {
    let mut out = desired.clone();
    let is_secret = desired.get("kind").and_then(Value::as_str) == Some("Secret")
        && desired.get("apiVersion").and_then(Value::as_str) == Some("v1");
    if is_secret
        && let Some(obj) = out.as_object_mut()
        && let Some(Value::Object(string_data)) = obj.remove("stringData")
    {
        let data = obj
            .entry("data")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(data) = data.as_object_mut() {
            for (k, v) in string_data {
                let text = v.as_str().unwrap_or_default();
                data.insert(k, Value::String(STANDARD.encode(text)));
            }
        }
    }
    out
}

fn value_contained(desired: &Value, live: &Value) -> bool {
    match (desired, live) {
        (Value::Object(d), Value::Object(l)) => d.iter().all(|(k, dv)| match l.get(k) {
            Some(lv) => value_contained(dv, lv),
            // An empty map, list or null we set is the same as an absent field.
            None => is_empty(dv),
        }),
        (Value::Object(d), Value::Null) => d.values().all(is_empty),
        (Value::Array(d), Value::Array(l)) => {
            d.len() == l.len() && d.iter().zip(l).all(|(dv, lv)| value_contained(dv, lv))
        }
        (Value::Array(d), Value::Null) => d.is_empty(),
        (Value::Null, _) => true,
        (Value::Number(d), Value::Number(l)) => d.as_f64() == l.as_f64(),
        (d, l) => d == l,
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::contained;
    use serde_json::json;

    #[test]
    fn defaults_and_status_added_by_the_server_do_not_count() {
        let desired = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "a", "labels": {"x": "1"}},
            "spec": {"replicas": 1, "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}});
        let live = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "a", "labels": {"x": "1", "other": "y"}, "resourceVersion": "5",
                         "managedFields": []},
            "spec": {"replicas": 1, "revisionHistoryLimit": 10, "template": {"spec": {
                "containers": [{"name": "c", "image": "i", "imagePullPolicy": "IfNotPresent"}]}}},
            "status": {"replicas": 0}});
        assert!(contained(&desired, &live));
    }

    #[test]
    fn a_changed_or_missing_field_counts() {
        let desired = json!({"spec": {"replicas": 3}});
        assert!(!contained(&desired, &json!({"spec": {"replicas": 1}})));
        assert!(!contained(&desired, &json!({"spec": {}})));
        let desired = json!({"spec": {"ports": [{"port": 1}, {"port": 2}]}});
        assert!(!contained(
            &desired,
            &json!({"spec": {"ports": [{"port": 1}]}})
        ));
        assert!(!contained(
            &desired,
            &json!({"spec": {"ports": [{"port": 2}, {"port": 1}]}})
        ));
    }

    #[test]
    fn numbers_compare_by_value_and_empty_equals_absent() {
        assert!(contained(&json!({"a": 1.0}), &json!({"a": 1})));
        assert!(contained(&json!({"a": {}, "b": [], "c": null}), &json!({})));
        assert!(!contained(&json!({"a": "1"}), &json!({"a": 1})));
    }

    #[test]
    fn secret_string_data_compares_with_stored_data() {
        let desired = json!({"apiVersion": "v1", "kind": "Secret", "stringData": {"k": "v"}});
        assert!(contained(
            &desired,
            &json!({"apiVersion": "v1", "kind": "Secret", "data": {"k": "dg=="}})
        ));
        assert!(!contained(
            &desired,
            &json!({"apiVersion": "v1", "kind": "Secret", "data": {"k": "dw=="}})
        ));
    }
}
