//! Pure comparison of a desired object with the live one: does applying change anything?
//!
//! The answer comes from the live object's **metadata** alone, so a watch-fed cache of
//! metadata (no specs, no Secret data) can answer it without a GET:
//! - The desired object is unchanged since we last applied it: our last apply wrote
//!   [`DESIRED_HASH_ANNOTATION`], a hash of the desired object, and it still matches.
//! - Nobody has changed a field we set since: server-side apply moves the ownership of
//!   a field whose value another manager changes (an Update such as `kubectl edit`, a merge
//!   patch, a forced apply) away from us, so every desired field must still be in our field
//!   manager's `metadata.managedFields` entry ([`uncovered`]). A field deleted by someone
//!   else leaves our set the same way.
//! - Our field manager owns no field we no longer set ([`owns_undesired`]): server-side
//!   apply removes such a field only when we apply without it (a label, a nodeSelector entry
//!   or an env var we stopped rendering).
//!
//! fieldsV1 paths are walked against the desired object: `f:` fields, `k:` keyed list items,
//! `v:` set items, `i:` indexes; an owned entry without children is a leaf or an atomic
//! value (owned as a whole). Values the server defaults or normalizes (a quantity's form, a
//! port's protocol) never matter: nothing compares live values with desired ones.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// The annotation our applies write: [`desired_hash`] of the object as desired then.
pub const DESIRED_HASH_ANNOTATION: &str = "hcp-olm.io/desired-hash";

/// A hash of `desired` (without [`DESIRED_HASH_ANNOTATION`]) over its canonical JSON
/// (object keys sorted), hex.
pub fn desired_hash(desired: &Value) -> String {
    let mut body = desired.clone();
    if let Some(a) = body
        .pointer_mut("/metadata/annotations")
        .and_then(Value::as_object_mut)
    {
        a.remove(DESIRED_HASH_ANNOTATION);
    }
    let mut bytes = Vec::new();
    canonical(&body, &mut bytes);
    let digest = Sha256::digest(&bytes);
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// `desired` with [`DESIRED_HASH_ANNOTATION`] set: the body our applies send.
pub fn with_hash(desired: &Value) -> Value {
    let hash = desired_hash(desired);
    let mut out = desired.clone();
    if let Some(obj) = out.as_object_mut() {
        let meta = obj
            .entry("metadata")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(meta) = meta.as_object_mut() {
            let ann = meta
                .entry("annotations")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Some(ann) = ann.as_object_mut() {
                ann.insert(DESIRED_HASH_ANNOTATION.into(), Value::String(hash));
            }
        }
    }
    out
}

/// Serializes with object keys sorted, so the hash does not depend on map order.
fn canonical(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push(b'{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend(Value::String(k.clone()).to_string().as_bytes());
                out.push(b':');
                canonical(&m[k], out);
            }
            out.push(b'}');
        }
        Value::Array(a) => {
            out.push(b'[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical(x, out);
            }
            out.push(b']');
        }
        other => out.extend(other.to_string().as_bytes()),
    }
}

/// Annotation a watch cache puts on its trimmed copy of an object (never on the server):
/// [`fields_digest`] of the managed fields it dropped.
pub const FIELDS_DIGEST_ANNOTATION: &str = "hcp-olm.io/cached-fields-digest";

/// A digest of `manager`'s server-side-apply entries on `live` (main resource): changes
/// whenever anyone takes a field from us or we apply a different set. Empty when there is
/// none.
pub fn fields_digest(live: &Value, manager: &str) -> String {
    let mut bytes = Vec::new();
    for f in our_entries(live, manager) {
        canonical(f, &mut bytes);
        bytes.push(b';');
    }
    if bytes.is_empty() {
        return String::new();
    }
    Sha256::digest(&bytes)[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The desired-hash annotation of an object (live or desired).
pub fn hash_annotation(v: &Value) -> Option<&str> {
    v.pointer("/metadata/annotations")
        .and_then(|a| a.get(DESIRED_HASH_ANNOTATION))
        .and_then(Value::as_str)
}

/// True when applying `desired` (as built by [`with_hash`]) over `live` would change
/// nothing. `live` needs only its `metadata` (annotations and managedFields).
pub fn up_to_date(desired: &Value, live: &Value, manager: &str) -> bool {
    let hash = |v: &Value| {
        v.pointer("/metadata/annotations")
            .and_then(|a| a.get(DESIRED_HASH_ANNOTATION))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let want = hash(desired).unwrap_or_else(|| desired_hash(desired));
    hash(live).as_deref() == Some(want.as_str())
        && uncovered(desired, live, manager).is_none()
        && owns_undesired(desired, live, manager).is_none()
}

/// Our field manager's server-side-apply entries on the main resource (not a subresource).
fn our_entries<'a>(live: &'a Value, manager: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    live.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(move |e| {
            e.get("manager").and_then(Value::as_str) == Some(manager)
                && e.get("operation").and_then(Value::as_str) == Some("Apply")
                && e.get("subresource")
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
        })
        .filter_map(|e| e.get("fieldsV1"))
}

/// The first desired field (as a path) that `manager` does not own on `live`: someone
/// else changed or removed it since our last apply, or we never applied it. None when
/// every desired field is ours.
pub fn uncovered(desired: &Value, live: &Value, manager: &str) -> Option<String> {
    // Secret stringData is stored (and owned) as data; either form may be what we own.
    // The object's identity (apiVersion, kind, name, namespace) is never a managed field.
    let identity_stripped = |v: Value| {
        let mut v = v;
        if let Some(o) = v.as_object_mut() {
            o.remove("apiVersion");
            o.remove("kind");
            if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove("name");
                m.remove("namespace");
            }
        }
        v
    };
    let forms = [
        identity_stripped(normalize(desired)),
        identity_stripped(desired.clone()),
    ];
    let mut first = None;
    for fields in our_entries(live, manager) {
        for form in &forms {
            match not_covered(fields, form, "") {
                None => return None,
                Some(p) => {
                    first.get_or_insert(p);
                }
            }
        }
    }
    Some(first.unwrap_or_else(|| "(no managed fields of ours)".into()))
}

/// Walks `desired` against a fieldsV1 set; the path of the first desired field it lacks.
fn not_covered(fields: &Value, desired: &Value, path: &str) -> Option<String> {
    let Value::Object(f) = fields else {
        return None;
    };
    // An owned entry without children: a leaf, or an atomic value owned as a whole.
    if f.keys().all(|k| k == ".") {
        return None;
    }
    match desired {
        Value::Object(d) => {
            for (k, v) in d {
                // An empty map, list or null we set may be recorded or not: not a field.
                if is_empty(v) {
                    continue;
                }
                let here = format!("{path}/f:{k}");
                let Some(sub) = f.get(&format!("f:{k}")) else {
                    return Some(here);
                };
                if let Some(p) = not_covered(sub, v, &here) {
                    return Some(p);
                }
            }
            None
        }
        Value::Array(items) => {
            let keyed: Vec<(Map<String, Value>, &Value)> = f
                .iter()
                .filter_map(|(k, sub)| {
                    let key = k.strip_prefix("k:")?;
                    match serde_json::from_str::<Value>(key) {
                        Ok(Value::Object(want)) => Some((want, sub)),
                        _ => None,
                    }
                })
                .collect();
            let set: Vec<Value> = f
                .keys()
                .filter_map(|k| serde_json::from_str(k.strip_prefix("v:")?).ok())
                .collect();
            for (i, item) in items.iter().enumerate() {
                let here = format!("{path}/{i}");
                if !keyed.is_empty() {
                    // A key field we leave to the server's default (a port's `protocol`)
                    // is in the owned key but not in our item: it matches.
                    let Some((_, sub)) = keyed.iter().find(|(want, _)| {
                        want.iter()
                            .all(|(kk, kv)| item.get(kk).is_none_or(|v| same(v, kv)))
                    }) else {
                        return Some(here);
                    };
                    if let Some(p) = not_covered(sub, item, &here) {
                        return Some(p);
                    }
                } else if !set.is_empty() {
                    if !set.iter().any(|v| same(v, item)) {
                        return Some(here);
                    }
                } else if let Some(sub) = f.get(&format!("i:{i}")) {
                    if let Some(p) = not_covered(sub, item, &here) {
                        return Some(p);
                    }
                } else if f.keys().any(|k| k.starts_with("i:")) {
                    return Some(here);
                }
            }
            None
        }
        _ => None,
    }
}

/// The first field (as a fieldsV1 path) that `manager` owns through server-side apply on
/// `live` (main resource, not a subresource) but `desired` no longer sets.
pub fn owns_undesired(desired: &Value, live: &Value, manager: &str) -> Option<String> {
    // Secret stringData is stored (and owned) as data; keep both forms to match either.
    let mut both = normalize(desired);
    if let (Some(sd), Some(obj)) = (desired.get("stringData"), both.as_object_mut()) {
        obj.insert("stringData".into(), sd.clone());
    }
    our_entries(live, manager).find_map(|f| missing(f, &both, ""))
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
    use super::{
        DESIRED_HASH_ANNOTATION, desired_hash, owns_undesired, uncovered, up_to_date, with_hash,
    };
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
        // no managed fields (an object someone else created): nothing of ours to remove,
        // but nothing desired is ours either
        assert_eq!(owns_undesired(&full, &json!({}), "us"), None);
        assert!(uncovered(&full, &json!({}), "us").is_some());
        assert!(!up_to_date(&no_label, &live, "us"));
    }

    /// A live object as our last apply of `desired` left it: the hash annotation and our
    /// managed fields.
    fn applied(desired: &serde_json::Value, fields: serde_json::Value) -> serde_json::Value {
        json!({"metadata": {
            "annotations": {DESIRED_HASH_ANNOTATION: desired_hash(desired), "theirs": "x"},
            "managedFields": managed(fields)}})
    }

    #[test]
    fn secret_string_data_owned_as_data_or_string_data() {
        let desired = json!({"apiVersion": "v1", "kind": "Secret", "stringData": {"k": "v"}});
        for owned in ["f:data", "f:stringData"] {
            let live = applied(
                &desired,
                json!({"f:metadata": {"f:annotations": {}}, owned: {"f:k": {}}}),
            );
            assert!(up_to_date(&with_hash(&desired), &live, "us"), "{owned}");
        }
    }

    fn deployment() -> serde_json::Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "a", "labels": {"x": "1"}, "annotations": {"note": ""}},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "a"}},
                "template": {"metadata": {"labels": {"app": "a"}}, "spec": {
                    "volumes": [{"name": "tmp", "emptyDir": {}}],
                    "containers": [{"name": "c", "image": "i", "args": ["--a", "--b"],
                        "ports": [{"containerPort": 8443}],
                        "resources": {"requests": {"cpu": "0.5"}}}]}}}})
    }

    /// What server-side apply records for [`deployment`] (ports keyed with the defaulted
    /// protocol, args atomic, the selector an atomic struct).
    fn deployment_fields() -> serde_json::Value {
        json!({
            "f:metadata": {"f:labels": {"f:x": {}}, "f:annotations": {"f:note": {},
                format!("f:{DESIRED_HASH_ANNOTATION}"): {}}},
            "f:spec": {"f:replicas": {}, "f:selector": {},
                "f:template": {"f:metadata": {"f:labels": {"f:app": {}}}, "f:spec": {
                    "f:volumes": {"k:{\"name\":\"tmp\"}": {".": {}, "f:name": {}, "f:emptyDir": {}}},
                    "f:containers": {"k:{\"name\":\"c\"}": {".": {}, "f:name": {}, "f:image": {},
                        "f:args": {},
                        "f:ports": {"k:{\"containerPort\":8443,\"protocol\":\"TCP\"}":
                            {".": {}, "f:containerPort": {}}},
                        "f:resources": {"f:requests": {"f:cpu": {}}}}}}}}
        })
    }

    #[test]
    fn a_converged_object_is_up_to_date_from_its_metadata_alone() {
        let desired = with_hash(&deployment());
        let live = applied(&desired, deployment_fields());
        assert_eq!(uncovered(&desired, &live, "us"), None);
        assert!(up_to_date(&desired, &live, "us"));
        // key order does not change the hash
        let reordered: serde_json::Value =
            serde_json::from_str(&serde_json::to_string_pretty(&deployment()).unwrap()).unwrap();
        assert_eq!(desired_hash(&reordered), desired_hash(&deployment()));
    }

    #[test]
    fn a_changed_desired_object_or_a_missing_hash_needs_an_apply() {
        let live = applied(&with_hash(&deployment()), deployment_fields());
        let mut changed = deployment();
        changed["spec"]["template"]["spec"]["containers"][0]["image"] = json!("j");
        assert!(!up_to_date(&with_hash(&changed), &live, "us"));
        let mut no_hash = live.clone();
        no_hash["metadata"]["annotations"]
            .as_object_mut()
            .unwrap()
            .remove(DESIRED_HASH_ANNOTATION);
        assert!(!up_to_date(&with_hash(&deployment()), &no_hash, "us"));
    }

    #[test]
    fn a_field_someone_else_changed_or_removed_needs_an_apply() {
        let desired = with_hash(&deployment());
        // `kubectl edit` of the image moves its ownership away from us
        let mut fields = deployment_fields();
        let c = &mut fields["f:spec"]["f:template"]["f:spec"]["f:containers"]["k:{\"name\":\"c\"}"];
        c.as_object_mut().unwrap().remove("f:image");
        let live = applied(&desired, fields);
        assert_eq!(
            uncovered(&desired, &live, "us").as_deref(),
            Some("/f:spec/f:template/f:spec/f:containers/0/f:image")
        );
        assert!(!up_to_date(&desired, &live, "us"));
        // a removed label (server-side apply drops a map left without owned children), a
        // removed list item
        let mut fields = deployment_fields();
        fields["f:metadata"]
            .as_object_mut()
            .unwrap()
            .remove("f:labels");
        assert!(uncovered(&desired, &applied(&desired, fields), "us").is_some());
        let mut fields = deployment_fields();
        fields["f:spec"]["f:template"]["f:spec"]["f:volumes"] =
            json!({"k:{\"name\":\"other\"}": {}});
        assert!(uncovered(&desired, &applied(&desired, fields), "us").is_some());
        // a set item
        let d = json!({"metadata": {"finalizers": ["a", "b"]}});
        let only_a = json!({"metadata": {"managedFields": managed(
            json!({"f:metadata": {"f:finalizers": {"v:\"a\"": {}}}}))}});
        assert!(uncovered(&d, &only_a, "us").is_some());
        // another manager's entry and our status entry do not make a field ours
        let theirs = json!({"metadata": {"managedFields": [
            {"manager": "them", "operation": "Update", "fieldsType": "FieldsV1",
             "fieldsV1": deployment_fields()},
            {"manager": "us", "operation": "Apply", "subresource": "status", "fieldsType": "FieldsV1",
             "fieldsV1": deployment_fields()}]}});
        assert!(uncovered(&desired, &theirs, "us").is_some());
    }
}
