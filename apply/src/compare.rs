//! Pure comparison of a desired object with the live one: does applying change anything?
//!
//! Two questions, both needed for "no":
//! - Is every field we set live with the same value ([`contained`])? The live object carries
//!   everything the API server and other managers added (defaults, status, managedFields,
//!   ...), which does not count. Lists are compared position by position with equal length
//!   (the lists we render are atomic or keyed lists we fully own).
//! - Does our field manager own a field we no longer set ([`owns_undesired`])? Server-side
//!   apply removes such a field only when we apply without it, so containment alone would
//!   keep a label, a nodeSelector entry or an env var we stopped rendering forever. The
//!   answer comes from our entry in `metadata.managedFields` (fieldsV1), walked against the
//!   desired object: `f:` fields, `k:` keyed list items, `v:` set items, `i:` indexes.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Map, Value};

/// True when applying `desired` over `live` would change nothing: every desired field is
/// live, and `manager` owns no field that `desired` leaves out.
pub fn up_to_date(desired: &Value, live: &Value, manager: &str) -> bool {
    contained(desired, live) && owns_undesired(desired, live, manager).is_none()
}

/// True when every field of `desired` is live with the same value.
pub fn contained(desired: &Value, live: &Value) -> bool {
    let desired = normalize(desired);
    value_contained(&desired, live)
}

/// The first field (as a fieldsV1 path) that `manager` owns through server-side apply on
/// `live` (main resource, not a subresource) but `desired` no longer sets.
pub fn owns_undesired(desired: &Value, live: &Value, manager: &str) -> Option<String> {
    let entries = live.pointer("/metadata/managedFields")?.as_array()?;
    // Secret stringData is stored (and owned) as data; keep both forms to match either.
    let mut both = normalize(desired);
    if let (Some(sd), Some(obj)) = (desired.get("stringData"), both.as_object_mut()) {
        obj.insert("stringData".into(), sd.clone());
    }
    entries
        .iter()
        .filter(|e| {
            e.get("manager").and_then(Value::as_str) == Some(manager)
                && e.get("operation").and_then(Value::as_str) == Some("Apply")
                && e.get("subresource")
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
        })
        .filter_map(|e| e.get("fieldsV1"))
        .find_map(|f| missing(f, &both, ""))
}

/// Walks a fieldsV1 set against the desired value; the path of the first owned entry that
/// the desired value lacks.
fn missing(fields: &Value, desired: &Value, path: &str) -> Option<String> {
    let Value::Object(fields) = fields else {
        return None;
    };
    for (key, sub) in fields {
        if key == "." {
            continue;
        }
        let here = format!("{path}/{key}");
        let child = if let Some(name) = key.strip_prefix("f:") {
            desired.as_object().and_then(|o| o.get(name))
        } else if let Some(k) = key.strip_prefix("k:") {
            let Ok(Value::Object(want)) = serde_json::from_str::<Value>(k) else {
                return Some(here);
            };
            desired.as_array().and_then(|items| {
                // A key field we leave to the server's default (a port's `protocol`) is
                // in the owned key but not in our item: it matches.
                items.iter().find(|item| {
                    want.iter()
                        .all(|(kk, kv)| item.get(kk).is_none_or(|v| same(v, kv)))
                })
            })
        } else if let Some(v) = key.strip_prefix("v:") {
            let Ok(want) = serde_json::from_str::<Value>(v) else {
                return Some(here);
            };
            desired
                .as_array()
                .and_then(|items| items.iter().find(|item| same(item, &want)))
        } else if let Some(i) = key.strip_prefix("i:") {
            let idx: usize = i.parse().ok()?;
            desired.as_array().and_then(|items| items.get(idx))
        } else {
            None
        };
        match child {
            None | Some(Value::Null) => return Some(here),
            Some(c) => {
                if let Some(p) = missing(sub, c, &here) {
                    return Some(p);
                }
            }
        }
    }
    None
}

/// JSON equality with numbers compared by value (`8443` and `8443.0` are one port).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
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
    use super::{contained, owns_undesired, up_to_date};
    use serde_json::json;

    fn managed(fields: serde_json::Value) -> serde_json::Value {
        json!([
            {"manager": "us", "operation": "Apply", "apiVersion": "v1", "fieldsType": "FieldsV1", "fieldsV1": fields},
            {"manager": "us", "operation": "Apply", "subresource": "status", "fieldsType": "FieldsV1",
             "fieldsV1": {"f:status": {"f:x": {}}}},
            {"manager": "them", "operation": "Apply", "fieldsType": "FieldsV1",
             "fieldsV1": {"f:metadata": {"f:labels": {"f:theirs": {}}}}}
        ])
    }

    #[test]
    fn owned_fields_we_no_longer_set_need_an_apply() {
        let fields = json!({
            "f:metadata": {"f:labels": {"f:a": {}, "f:extra": {}}},
            "f:spec": {"f:template": {"f:spec": {
                "f:nodeSelector": {"f:pool": {}},
                "f:containers": {"k:{\"name\":\"c\"}": {".": {}, "f:name": {},
                    "f:env": {"k:{\"name\":\"A\"}": {".": {}, "f:name": {}, "f:value": {}}},
                    "f:ports": {"k:{\"containerPort\":8443,\"protocol\":\"TCP\"}": {".": {}}}}},
                "f:finalizers": {"v:\"x\"": {}}}}}
        });
        let live = json!({"metadata": {"labels": {"a": "1", "extra": "y", "theirs": "t"},
                                       "managedFields": managed(fields)}});
        let full = json!({"metadata": {"labels": {"a": "1", "extra": "y"}},
            "spec": {"template": {"spec": {"nodeSelector": {"pool": "p"},
                "containers": [{"name": "c", "env": [{"name": "A", "value": "1"}],
                                "ports": [{"containerPort": 8443, "protocol": "TCP"}]}],
                "finalizers": ["x"]}}}});
        assert_eq!(owns_undesired(&full, &live, "us"), None);
        // another manager's label and our status subresource entry do not count
        assert_eq!(
            owns_undesired(&full, &live, "them").as_deref(),
            Some("/f:metadata/f:labels/f:theirs")
        );
        let mut no_label = full.clone();
        no_label["metadata"]["labels"]
            .as_object_mut()
            .unwrap()
            .remove("extra");
        assert_eq!(
            owns_undesired(&no_label, &live, "us").as_deref(),
            Some("/f:metadata/f:labels/f:extra")
        );
        let mut no_env = full.clone();
        no_env["spec"]["template"]["spec"]["containers"][0]["env"] = json!([]);
        assert!(
            owns_undesired(&no_env, &live, "us")
                .unwrap()
                .contains("f:env")
        );
        let mut no_protocol = full.clone();
        no_protocol["spec"]["template"]["spec"]["containers"][0]["ports"][0]
            .as_object_mut()
            .unwrap()
            .remove("protocol");
        assert_eq!(
            owns_undesired(&no_protocol, &live, "us"),
            None,
            "defaulted key field"
        );
        let mut other_port = full.clone();
        other_port["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] =
            json!(9443);
        assert!(
            owns_undesired(&other_port, &live, "us")
                .unwrap()
                .contains("containerPort")
        );
        let mut no_set_item = full.clone();
        no_set_item["spec"]["template"]["spec"]["finalizers"] = json!(["y"]);
        assert!(
            owns_undesired(&no_set_item, &live, "us")
                .unwrap()
                .contains("v:")
        );
        // no managed fields (an object someone else created): containment decides
        assert_eq!(owns_undesired(&full, &json!({}), "us"), None);
        assert!(!up_to_date(&no_label, &live, "us"));
    }

    #[test]
    fn secret_string_data_owned_as_data_or_string_data() {
        let desired = json!({"apiVersion": "v1", "kind": "Secret", "stringData": {"k": "v"}});
        for owned in ["f:data", "f:stringData"] {
            let live = json!({"apiVersion": "v1", "kind": "Secret", "data": {"k": "dg=="},
                "metadata": {"managedFields": managed(json!({owned: {"f:k": {}}}))}});
            assert!(up_to_date(&desired, &live, "us"), "{owned}");
        }
    }

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
