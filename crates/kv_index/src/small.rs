//! A vector that keeps one element inline: most nodes hold one tenant and have at most
//! one child, and an inline slot saves both the allocation and a cache miss per visit.

use std::ops::{Deref, DerefMut};

#[derive(Debug, Clone, Default)]
pub(crate) enum Small<X> {
    #[default]
    Empty,
    One(X),
    Many(Vec<X>),
}

impl<X: Copy> Small<X> {
    pub(crate) fn insert(&mut self, i: usize, x: X) {
        *self = match std::mem::take(self) {
            Small::Empty => Small::One(x),
            Small::One(a) => {
                let mut v = Vec::with_capacity(2);
                v.push(a);
                v.insert(i, x);
                Small::Many(v)
            }
            Small::Many(mut v) => {
                v.insert(i, x);
                Small::Many(v)
            }
        };
    }

    pub(crate) fn remove(&mut self, i: usize) {
        *self = match std::mem::take(self) {
            Small::Empty | Small::One(_) => Small::Empty,
            Small::Many(mut v) => {
                v.remove(i);
                match v.as_slice() {
                    [a] => Small::One(*a),
                    _ => Small::Many(v),
                }
            }
        };
    }

    /// Bytes allocated outside the inline slot.
    pub(crate) fn heap_bytes(&self) -> usize {
        match self {
            Small::Many(v) => v.capacity() * size_of::<X>(),
            _ => 0,
        }
    }
}

impl<X> Deref for Small<X> {
    type Target = [X];
    fn deref(&self) -> &[X] {
        match self {
            Small::Empty => &[],
            Small::One(x) => std::slice::from_ref(x),
            Small::Many(v) => v,
        }
    }
}

impl<X> DerefMut for Small<X> {
    fn deref_mut(&mut self) -> &mut [X] {
        match self {
            Small::Empty => &mut [],
            Small::One(x) => std::slice::from_mut(x),
            Small::Many(v) => v,
        }
    }
}

impl<'a, X> IntoIterator for &'a Small<X> {
    type Item = &'a X;
    type IntoIter = std::slice::Iter<'a, X>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}
