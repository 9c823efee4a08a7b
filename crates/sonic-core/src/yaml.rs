//! How sonic-core reads YAML written by people it does not trust (DAG files through the API,
//! parameter files, catalogs): tight parser budgets, and a second pass that turns an error's
//! line and column into the field path it happened at.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_saphyr::options::{DuplicateKeyPolicy, NonFiniteFloatPolicy};
use serde_saphyr::{Budget, Options, Spanned};

/// The largest file the YAML readers accept, in bytes. Real DAG files are a few KiB.
pub const MAX_YAML_BYTES: usize = 1024 * 1024;

/// Parser options for untrusted files: a billion-laughs file, deep nesting or a flood of nodes is
/// refused after a bounded amount of work and memory, not expanded.
pub(crate) fn options() -> Options {
    let mut budget = Budget::default();
    budget.max_events = 400_000;
    budget.max_nodes = 100_000;
    budget.max_depth = 32;
    budget.flow_nesting_limit = 32;
    budget.max_aliases = 1_000;
    budget.max_anchors = 1_000;
    budget.max_documents = 1;
    budget.max_total_scalar_bytes = 2 * MAX_YAML_BYTES;
    budget.max_recorded_anchor_events = 20_000;
    budget.max_recorded_anchor_bytes = 2 * MAX_YAML_BYTES;
    budget.max_merge_keys = 1_000;
    let mut options = Options::default();
    options.budget = Some(budget);
    // Each alias may replay what its anchor holds; all of them together at most this many events.
    options.alias_limits.max_total_replayed_events = 20_000;
    options.alias_limits.max_replay_stack_depth = 16;
    // `!!python/object` and friends mean nothing here: refuse rather than silently ignore.
    options.reject_unsupported_tags = true;
    options.reject_tagged_field_names = true;
    options
}

/// Whether the text holds nothing but blank lines and comments.
pub(crate) fn is_blank(text: &str) -> bool {
    text.lines().all(|l| {
        let t = l.trim_start_matches('\u{feff}').trim();
        t.is_empty() || t.starts_with('#')
    })
}

/// serde-saphyr's terse messages, said for people who write the file.
pub(crate) fn plain_message(message: &str) -> String {
    let replaced = match message {
        "expected mapping start" => "expected a mapping (key: value lines)",
        "expected sequence start" => "expected a list",
        "expected string scalar" => "expected a string",
        m if m.starts_with("data did not match any variant of untagged enum") => {
            "expected a number or a string"
        }
        m if m.starts_with("budget breached: Documents") => {
            "the file holds several YAML documents (---); a DAG file is one"
        }
        m if m.starts_with("budget breached") => {
            return format!(
                "{m}: the file is larger, more nested or uses more aliases than a DAG file may"
            );
        }
        m if m.starts_with("multiple YAML documents detected") => {
            "the file holds several YAML documents (---); a DAG file is one"
        }
        m => m,
    };
    replaced.to_owned()
}

/// The path (`functions[0].command[1]`) of the node that starts at `line`:`column`, or of the
/// last node starting before it; `None` when the text does not parse even as plain YAML.
pub(crate) fn path_at(text: &str, line: u64, column: u64) -> Option<String> {
    let mut options = options();
    // The error may be the duplicate, the tag or the `.nan` itself: let them through to find
    // their place.
    options.duplicate_keys = DuplicateKeyPolicy::PassThrough;
    options.reject_unsupported_tags = false;
    options.non_finite_float_policy = NonFiniteFloatPolicy::PassThrough;
    let root: Spanned<Node> = serde_saphyr::from_str_with_options(text, options).ok()?;
    let mut finder = Finder {
        at: (line, column),
        found: None,
        exact: false,
    };
    finder.walk(&root, String::new());
    finder.found
}

/// Looks for the node at `at` in document order: the deepest node starting exactly there, else the
/// last node that starts before it.
struct Finder {
    at: (u64, u64),
    found: Option<String>,
    exact: bool,
}

impl Finder {
    fn consider(&mut self, s: &Spanned<impl Sized>, path: &str) {
        let pos = (s.referenced.line(), s.referenced.column());
        // Once a node starts exactly there, only a deeper one starting there too replaces it.
        if pos > self.at || (self.exact && pos != self.at) {
            return;
        }
        self.found = Some(path.to_owned());
        self.exact = pos == self.at;
    }

    fn walk(&mut self, node: &Spanned<Node>, path: String) {
        self.consider(node, &path);
        match &node.value {
            Node::Scalar => {}
            Node::Seq(items) => {
                for (i, item) in items.iter().enumerate() {
                    self.walk(item, format!("{path}[{i}]"));
                }
            }
            Node::Map(entries) => {
                for (key, value) in entries {
                    let child = if path.is_empty() {
                        key.value.0.clone()
                    } else {
                        format!("{path}.{}", key.value.0)
                    };
                    self.consider(key, &child);
                    self.walk(value, child);
                }
            }
        }
    }
}

/// Any YAML node, with the place of every child.
enum Node {
    Scalar,
    Seq(Vec<Spanned<Node>>),
    Map(Vec<(Spanned<Key>, Spanned<Node>)>),
}

/// A mapping key as text (`?` for a key that is itself a list or a mapping).
struct Key(String);

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML node")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_i128<E: de::Error>(self, _: i128) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_u128<E: de::Error>(self, _: u128) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_bytes<E: de::Error>(self, _: &[u8]) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_none<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        Node::deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Spanned<Node>>()? {
            items.push(item);
        }
        Ok(Node::Seq(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<Spanned<Key>>()? {
            let value = map.next_value::<Spanned<Node>>()?;
            entries.push((key, value));
        }
        Ok(Node::Map(entries))
    }
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(KeyVisitor)
    }
}

struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a mapping key")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Key, E> {
        Ok(Key(v.to_string()))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Key, E> {
        Ok(Key(v.to_string()))
    }
    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Key, E> {
        Ok(Key(v.to_string()))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Key, E> {
        Ok(Key(v.to_string()))
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Key, E> {
        Ok(Key(v.to_string()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Key, E> {
        Ok(Key(v.to_string()))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
        Ok(Key(v.to_owned()))
    }
    fn visit_bytes<E: de::Error>(self, _: &[u8]) -> Result<Key, E> {
        Ok(Key("?".to_owned()))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Key, E> {
        Ok(Key("~".to_owned()))
    }
    fn visit_none<E: de::Error>(self) -> Result<Key, E> {
        Ok(Key("~".to_owned()))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Key, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Key("?".to_owned()))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Key, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Key("?".to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_of_places() {
        let text = "name: t\nfunctions:\n  - { name: a, image: img, command: [run, {x: 1}] }\n";
        assert_eq!(path_at(text, 1, 7).as_deref(), Some("name"));
        assert_eq!(path_at(text, 1, 1).as_deref(), Some("name"));
        assert_eq!(
            path_at(text, 3, 43).as_deref(),
            Some("functions[0].command[1]")
        );
        assert_eq!(path_at(text, 3, 16).as_deref(), Some("functions[0].image"));
        assert_eq!(path_at("a: [\n", 1, 1), None);
    }
}
