//! A tiny writer for JSON objects whose keys keep the order they are written in.
//!
//! Why not `serde_json::json!`: without the `preserve_order` feature its map
//! sorts keys alphabetically, and real servers don't (llama.cpp writes
//! `choices` first, Anthropic writes `type` first). The simulator promises
//! output shaped like the real captures, so objects are written field by
//! field; values are still escaped by serde_json, so the output is always
//! valid JSON.

use serde::Serialize;

/// One JSON object under construction. Build with [`Obj::new`], add fields
/// in wire order, finish with [`Obj::finish`].
#[derive(Clone, Debug)]
pub(crate) struct Obj {
    buf: String,
}

impl Obj {
    pub(crate) fn new() -> Obj {
        Obj {
            buf: String::from("{"),
        }
    }

    fn key(&mut self, key: &str) {
        if self.buf.len() > 1 {
            self.buf.push(',');
        }
        self.buf.push_str(&to_json(key));
        self.buf.push(':');
    }

    /// Adds `key` with any serializable value (strings are escaped, `None`
    /// is `null`, non-finite floats are `null` as nlohmann::json writes them).
    pub(crate) fn field(mut self, key: &str, value: impl Serialize) -> Obj {
        self.key(key);
        self.buf.push_str(&to_json(value));
        self
    }

    /// Adds `key` with a nested object.
    pub(crate) fn obj(mut self, key: &str, value: Obj) -> Obj {
        self.key(key);
        self.buf.push_str(&value.finish());
        self
    }

    /// Adds `key` with a nested object when there is one; omits the key
    /// otherwise (servers omit optional blocks rather than send `null`).
    pub(crate) fn opt_obj(self, key: &str, value: Option<Obj>) -> Obj {
        match value {
            Some(v) => self.obj(key, v),
            None => self,
        }
    }

    /// Adds `key` with an array of objects.
    pub(crate) fn arr(mut self, key: &str, items: Vec<Obj>) -> Obj {
        self.key(key);
        self.buf.push('[');
        for (i, item) in items.into_iter().enumerate() {
            if i > 0 {
                self.buf.push(',');
            }
            self.buf.push_str(&item.finish());
        }
        self.buf.push(']');
        self
    }

    /// The finished object as compact JSON text.
    pub(crate) fn finish(mut self) -> String {
        self.buf.push('}');
        self.buf
    }
}

/// serde_json text of a value. Our values (strings, numbers, bools,
/// options, slices of those) cannot fail to serialize; `null` is the
/// fallback that keeps the output valid JSON if one ever did.
fn to_json(value: impl Serialize) -> String {
    serde_json::to_string(&value).unwrap_or_else(|_| String::from("null"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_field_order_and_escapes() {
        let text = Obj::new()
            .field("z", 1)
            .field("a", "q\"uote\n")
            .field("none", None::<&str>)
            .obj("nested", Obj::new().field("b", true))
            .opt_obj("absent", None)
            .arr("list", vec![Obj::new(), Obj::new().field("x", 1.5)])
            .field("inf", f64::INFINITY)
            .finish();
        assert_eq!(
            text,
            r#"{"z":1,"a":"q\"uote\n","none":null,"nested":{"b":true},"list":[{},{"x":1.5}],"inf":null}"#
        );
        let parsed: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(parsed["a"], "q\"uote\n");
    }

    #[test]
    fn empty_object() {
        assert_eq!(Obj::new().finish(), "{}");
    }
}
