//! Recency lists over (node, tenant) entries.
//!
//! Every entry sits on two intrusive doubly linked lists: the global one and its tenant's
//! one (a subsequence of the global order). The tree keeps one invariant on them: an entry
//! comes after every entry of the same tenant on a child node. The head of either list is
//! then always a leaf for its tenant, so leaf-first LRU eviction is a pop, with no walk and
//! no heap.

/// The "no entry" link.
pub(crate) const NIL: u32 = u32::MAX;

#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// Index of the tenant's slot in the tree.
    pub(crate) tslot: u32,
    pub(crate) node: u32,
    pub(crate) stamp: u64,
    prev: u32,
    next: u32,
    tprev: u32,
    tnext: u32,
}

/// One tenant's list ends and its unit count.
#[derive(Debug, Clone)]
pub(crate) struct TenantList {
    pub(crate) head: u32,
    tail: u32,
    pub(crate) units: usize,
}

impl TenantList {
    pub(crate) fn new() -> Self {
        Self {
            head: NIL,
            tail: NIL,
            units: 0,
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Lru {
    entries: Vec<Entry>,
    free: Vec<u32>,
    head: u32,
    tail: u32,
}

impl Lru {
    pub(crate) fn new() -> Self {
        Self {
            entries: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
        }
    }

    pub(crate) fn get(&self, e: u32) -> &Entry {
        &self.entries[e as usize]
    }

    /// The least recently used entry of all tenants.
    pub(crate) fn head(&self) -> Option<u32> {
        (self.head != NIL).then_some(self.head)
    }

    #[cfg(test)]
    pub(crate) fn live(&self) -> usize {
        self.entries.len() - self.free.len()
    }

    pub(crate) fn size_bytes(&self) -> usize {
        self.entries.capacity() * size_of::<Entry>() + self.free.capacity() * size_of::<u32>()
    }

    /// Global order, oldest first (tests and invariant checks).
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &Entry)> {
        let mut cur = self.head;
        std::iter::from_fn(move || {
            (cur != NIL).then(|| {
                let e = cur;
                cur = self.entries[e as usize].next;
                (e, &self.entries[e as usize])
            })
        })
    }

    fn alloc(&mut self, tslot: u32, node: u32, stamp: u64) -> u32 {
        let entry = Entry {
            tslot,
            node,
            stamp,
            prev: NIL,
            next: NIL,
            tprev: NIL,
            tnext: NIL,
        };
        match self.free.pop() {
            Some(e) => {
                self.entries[e as usize] = entry;
                e
            }
            None => {
                debug_assert!(self.entries.len() < NIL as usize);
                self.entries.push(entry);
                (self.entries.len() - 1) as u32
            }
        }
    }

    /// A new most recent entry.
    pub(crate) fn push_back(
        &mut self,
        list: &mut TenantList,
        tslot: u32,
        node: u32,
        stamp: u64,
    ) -> u32 {
        let e = self.alloc(tslot, node, stamp);
        self.link_after(e, self.tail);
        self.tlink_after(list, e, list.tail);
        e
    }

    /// A new entry placed just after `after` in both lists (an edge split: the new parent
    /// must stay younger than the child it was cut from, and older than everything else).
    pub(crate) fn insert_after(
        &mut self,
        list: &mut TenantList,
        after: u32,
        tslot: u32,
        node: u32,
        stamp: u64,
    ) -> u32 {
        let e = self.alloc(tslot, node, stamp);
        self.link_after(e, after);
        self.tlink_after(list, e, after);
        e
    }

    pub(crate) fn move_to_back(&mut self, list: &mut TenantList, e: u32, stamp: u64) {
        self.entries[e as usize].stamp = stamp;
        if self.tail != e {
            self.unlink(e);
            self.link_after(e, self.tail);
        }
        if list.tail != e {
            self.tunlink(list, e);
            self.tlink_after(list, e, list.tail);
        }
    }

    pub(crate) fn remove(&mut self, list: &mut TenantList, e: u32) {
        self.unlink(e);
        self.tunlink(list, e);
        self.free.push(e);
    }

    fn unlink(&mut self, e: u32) {
        let (prev, next) = {
            let en = &self.entries[e as usize];
            (en.prev, en.next)
        };
        match prev {
            NIL => self.head = next,
            p => self.entries[p as usize].next = next,
        }
        match next {
            NIL => self.tail = prev,
            n => self.entries[n as usize].prev = prev,
        }
    }

    /// Links `e` after `after`, or at the front when `after` is NIL.
    fn link_after(&mut self, e: u32, after: u32) {
        let next = match after {
            NIL => self.head,
            a => self.entries[a as usize].next,
        };
        {
            let en = &mut self.entries[e as usize];
            en.prev = after;
            en.next = next;
        }
        match after {
            NIL => self.head = e,
            a => self.entries[a as usize].next = e,
        }
        match next {
            NIL => self.tail = e,
            n => self.entries[n as usize].prev = e,
        }
    }

    fn tunlink(&mut self, list: &mut TenantList, e: u32) {
        let (prev, next) = {
            let en = &self.entries[e as usize];
            (en.tprev, en.tnext)
        };
        match prev {
            NIL => list.head = next,
            p => self.entries[p as usize].tnext = next,
        }
        match next {
            NIL => list.tail = prev,
            n => self.entries[n as usize].tprev = prev,
        }
    }

    fn tlink_after(&mut self, list: &mut TenantList, e: u32, after: u32) {
        let next = match after {
            NIL => list.head,
            a => self.entries[a as usize].tnext,
        };
        {
            let en = &mut self.entries[e as usize];
            en.tprev = after;
            en.tnext = next;
        }
        match after {
            NIL => list.head = e,
            a => self.entries[a as usize].tnext = e,
        }
        match next {
            NIL => list.tail = e,
            n => self.entries[n as usize].tprev = e,
        }
    }
}
