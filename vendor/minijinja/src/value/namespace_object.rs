use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use crate::error::{Error, ErrorKind};
use crate::value::{Enumerator, Object, ObjectRepr, Value, ValueMap};

/// The most items and containers a value assigned to a namespace may expand to, counting a
/// part shared by several containers once for each of them (as printing, serializing and
/// comparing it do).
const MAX_ASSIGNED_SIZE: usize = 1 << 20;

/// This object exists for the `namespace` function.
///
/// It's special in that it behaves like a dictionary in many ways but it's the only
/// object that can be used with `{% set %}` assignments.  This is used internally
/// in the vm via downcasting.
#[derive(Debug, Default)]
pub(crate) struct Namespace {
    data: Mutex<BTreeMap<Arc<str>, Value>>,
}

impl Object for Namespace {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.data.lock().unwrap().get(some!(key.as_str())).cloned()
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        let data = self.data.lock().unwrap();
        let keys = data.keys().cloned().map(Value::from);
        Enumerator::Values(keys.collect())
    }
}

impl Namespace {
    pub(crate) fn set_value(&self, key: &str, value: Value) {
        self.data.lock().unwrap().insert(key.into(), value);
    }

    /// Assigns `value` to the attribute `key` of this namespace, which `this` holds
    /// (`{% set ns.key = value %}`).
    ///
    /// A namespace is the only value a template can change once made, so it is the only way
    /// to build a value that contains itself (`{% set ns.x = ns %}`) or one that grows on
    /// every turn of a loop (`{% set ns.x = [ns.x] %}`, `{% set ns.x = [ns.x, ns.x] %}`).
    /// Printing, serializing, comparing or even dropping such a value recurses without bound
    /// or runs for longer than the template's fuel allows, and a stack overflow aborts the
    /// process. So an assignment is refused when the value reaches this namespace, nests
    /// deeper than `max_depth` (the environment's recursion limit) or expands past
    /// [`MAX_ASSIGNED_SIZE`]. See [`storable`] for the lazy iterables it holds.
    pub(crate) fn assign(
        &self,
        key: &str,
        value: Value,
        this: &Value,
        max_depth: usize,
    ) -> Result<(), Error> {
        let target = this.as_object().map(|obj| obj.addr());
        let value = storable(&value, target, max_depth)?;
        self.set_value(key, value);
        Ok(())
    }
}

/// `value` as a namespace may hold it: checked as [`Namespace::assign`] says (`target`, the
/// namespace it goes into, if it already exists), with each container in it that may change
/// after the check copied to a list or a map of what it holds now. Lists, maps and namespaces
/// cannot change behind the check (a namespace checks what it is given), but other objects
/// are views: a lazy iterable (`ns|items`, `ns.values()`) reads the namespace each time it is
/// iterated and `loop` moves on to other items, so `{% set ns.x = ns|items %}` or
/// `{% for x in [ns] %}{% set ns.l = loop %}{% endfor %}` would make a cycle that no walk over
/// the view's items now could see.
pub(crate) fn storable(
    value: &Value,
    target: Option<usize>,
    max_depth: usize,
) -> Result<Value, Error> {
    let mut check = AssignCheck {
        target,
        max_depth,
        walked: HashMap::new(),
    };
    let walked = check.walk(value, 0)?;
    Ok(walked.replacement.unwrap_or_else(|| value.clone()))
}

/// One walk over a value about to be stored in a namespace (see [`storable`]).
struct AssignCheck {
    /// The namespace it goes into.
    target: Option<usize>,
    max_depth: usize,
    /// Each container already walked, by address, with what the walk found. The container is
    /// kept alive with it, so that a temporary one an iterable made cannot be freed and its
    /// address taken by another while the walk runs.
    walked: HashMap<usize, (Value, Walked)>,
}

/// What the walk found of one value.
#[derive(Clone)]
struct Walked {
    /// Its items and containers, counting a part shared by several containers once for each.
    size: usize,
    /// The value with its lazy iterables made lists, where it held any.
    replacement: Option<Value>,
}

impl AssignCheck {
    /// Walks `value`, found `depth` containers down; an error when it reaches the target
    /// namespace or is over a limit.
    fn walk(&mut self, value: &Value, depth: usize) -> Result<Walked, Error> {
        let Some(obj) = value.as_object() else {
            return Ok(Walked {
                size: 1,
                replacement: None,
            });
        };
        let addr = obj.addr();
        if Some(addr) == self.target {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "cannot assign a value that contains the namespace to one of its attributes",
            ));
        }
        if let Some((_, walked)) = self.walked.get(&addr) {
            return Ok(walked.clone());
        }
        if depth >= self.max_depth {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!(
                    "cannot assign a value nested more than {} levels deep to a namespace",
                    self.max_depth
                ),
            ));
        }
        // Whether the container holds what it holds for good (see `storable`).
        let settled = obj.downcast_ref::<Vec<Value>>().is_some()
            || obj.downcast_ref::<ValueMap>().is_some()
            || obj.downcast_ref::<Namespace>().is_some();
        let mut size = 1usize;
        let mut replaced = !settled;
        let walked = match obj.repr() {
            ObjectRepr::Map => {
                let mut pairs = Vec::new();
                for (key, item) in obj.try_iter_pairs().into_iter().flatten() {
                    let key = self.child(&mut size, key, depth, &mut replaced)?;
                    let item = self.child(&mut size, item, depth, &mut replaced)?;
                    pairs.push((key, item));
                }
                Walked {
                    size,
                    replacement: replaced.then(|| Value::from_iter(pairs)),
                }
            }
            ObjectRepr::Seq | ObjectRepr::Iterable => {
                let mut items = Vec::new();
                for item in obj.try_iter().into_iter().flatten() {
                    items.push(self.child(&mut size, item, depth, &mut replaced)?);
                }
                Walked {
                    size,
                    replacement: replaced.then(|| Value::from(items)),
                }
            }
            // Opaque (a macro): printed and serialized by name, never through what it holds.
            ObjectRepr::Plain => Walked {
                size,
                replacement: None,
            },
        };
        self.walked.insert(addr, (value.clone(), walked.clone()));
        Ok(walked)
    }

    /// Walks `item`, a child of a container `depth` levels down whose size so far is `size`:
    /// adds its size, notes in `replaced` whether it changed, and returns it as it is stored.
    fn child(
        &mut self,
        size: &mut usize,
        item: Value,
        depth: usize,
        replaced: &mut bool,
    ) -> Result<Value, Error> {
        let walked = self.walk(&item, depth + 1)?;
        *size = size.saturating_add(walked.size);
        if *size > MAX_ASSIGNED_SIZE {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!(
                    "cannot assign a value of more than {MAX_ASSIGNED_SIZE} items to a namespace"
                ),
            ));
        }
        match walked.replacement {
            Some(replacement) => {
                *replaced = true;
                Ok(replacement)
            }
            None => Ok(item),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::Environment;

    fn render(src: &str) -> Result<String, String> {
        let mut env = Environment::new();
        env.set_recursion_limit(64);
        env.render_str(src, ()).map_err(|e| e.to_string())
    }

    fn refused(src: &str, what: &str) {
        match render(src) {
            Err(msg) => assert!(msg.contains(what), "{src}: {msg}"),
            Ok(out) => panic!("{src} rendered {out:?}"),
        }
    }

    #[test]
    fn a_namespace_cannot_hold_itself() {
        let cycle = "contains the namespace";
        refused(
            "{% set ns = namespace() %}{% set ns.x = ns %}{{ ns }}",
            cycle,
        );
        refused(
            "{% set ns = namespace() %}{% set ns.x = [1, {'a': ns}] %}{{ ns }}",
            cycle,
        );
        refused(
            "{% set a = namespace() %}{% set b = namespace(y=a) %}{% set a.x = b %}{{ a == b }}",
            cycle,
        );
        refused(
            "{% set a = namespace() %}{% set a.x = namespace(z=[a]) %}{{ a }}",
            cycle,
        );
        refused(
            "{% set ns = namespace() %}{% for x in [1, ns] %}{% set ns.l = loop %}{% endfor %}",
            cycle,
        );
    }

    #[test]
    fn a_namespace_value_is_bounded_in_depth_and_size() {
        refused("{% set ns = namespace(x=0) %}{% for i in range(90000) %}{% set ns.x = [ns.x] %}{% endfor %}", "64 levels");
        refused("{% set ns = namespace(x=0) %}{% for i in range(60) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}", "items");
        assert_eq!(
            render("{% set ns = namespace(x=0) %}{% for i in range(63) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x|length }}"),
            Ok("1".into())
        );
    }

    #[test]
    fn a_namespace_keeps_what_a_view_yields_when_assigned() {
        assert_eq!(
            render("{% set ns = namespace(x=0) %}{% set ns.x = ns|items %}{{ ns.x }}"),
            Ok(r#"[["x", 0]]"#.into())
        );
        assert_eq!(
            render("{% set ns = namespace() %}{% for x in [1, 2, 3] %}{% if loop.first %}{% set ns.l = loop %}{% endif %}{% endfor %}{{ ns.l.index }}"),
            Ok("1".into())
        );
        assert_eq!(
            render("{% set ns = namespace(n=0, seen=false) %}{% for i in range(3) %}{% set ns.n = ns.n + i %}{% set ns.seen = true %}{% endfor %}{{ ns.n }} {{ ns.seen }}"),
            Ok("3 True".into())
        );
    }
}
