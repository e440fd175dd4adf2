//! Recency lists over (node, tenant) entries.
//!
//! Every entry sits on two intrusive doubly linked lists: the global one and its tenant's
//! one (a subsequence of the global order). The tree keeps one invariant on them: an entry
//! comes after every entry of the same tenant on a child node. The head of either list is
//! then always a leaf for its tenant, so leaf-first LRU eviction is a pop, with no walk and
//! no heap.

/// The "no entry" link.
pub(crate) const NIL: u32 = u32::MAX;

const GLOBAL: usize = 0;
const TENANT: usize = 1;

#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// Index of the tenant's slot in the tree.
    pub(crate) tslot: u32,
    pub(crate) node: u32,
    pub(crate) stamp: u64,
    /// Links on the global list (`[GLOBAL]`) and on the tenant's list (`[TENANT]`).
    prev: [u32; 2],
    next: [u32; 2],
}

#[derive(Debug, Clone, Copy)]
struct Ends {
    head: u32,
    tail: u32,
}

const EMPTY: Ends = Ends {
    head: NIL,
    tail: NIL,
};

/// One tenant's list ends and its unit count.
#[derive(Debug, Clone)]
pub(crate) struct TenantList {
    ends: Ends,
    pub(crate) units: usize,
}

impl TenantList {
    pub(crate) fn new() -> Self {
        Self {
            ends: EMPTY,
            units: 0,
        }
    }

    /// The tenant's least recently used entry.
    pub(crate) fn head(&self) -> Option<u32> {
        (self.ends.head != NIL).then_some(self.ends.head)
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Lru {
    entries: Vec<Entry>,
    free: Vec<u32>,
    ends: Ends,
}

impl Lru {
    pub(crate) fn new() -> Self {
        Self {
            entries: Vec::new(),
            free: Vec::new(),
            ends: EMPTY,
        }
    }

    pub(crate) fn get(&self, e: u32) -> &Entry {
        &self.entries[e as usize]
    }

    /// The least recently used entry of all tenants.
    pub(crate) fn head(&self) -> Option<u32> {
        (self.ends.head != NIL).then_some(self.ends.head)
    }

    pub(crate) fn size_bytes(&self) -> usize {
        self.entries.capacity() * size_of::<Entry>() + self.free.capacity() * size_of::<u32>()
    }

    #[cfg(test)]
    pub(crate) fn live(&self) -> usize {
        self.entries.len() - self.free.len()
    }

    /// Global order, oldest first (invariant checks).
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Entry> {
        let mut cur = self.ends.head;
        std::iter::from_fn(move || {
            (cur != NIL).then(|| {
                let e = &self.entries[cur as usize];
                cur = e.next[GLOBAL];
                e
            })
        })
    }

    /// A new most recent entry.
    pub(crate) fn reserve(&mut self, additional: usize) {
        self.entries.reserve(additional);
    }

    pub(crate) fn push_back(
        &mut self,
        list: &mut TenantList,
        tslot: u32,
        node: u32,
        stamp: u64,
    ) -> u32 {
        let e = self.alloc(tslot, node, stamp);
        let (gtail, ttail) = (self.ends.tail, list.ends.tail);
        link_after(&mut self.entries, &mut self.ends, GLOBAL, e, gtail);
        link_after(&mut self.entries, &mut list.ends, TENANT, e, ttail);
        e
    }

    /// A new entry placed just after `global` on the global list and just after `tenant`
    /// on its tenant's (an edge split: the new parent must stay younger than the child it
    /// was cut from, and older than everything else).
    pub(crate) fn insert_after(
        &mut self,
        list: &mut TenantList,
        (global, tenant): (u32, u32),
        tslot: u32,
        node: u32,
        stamp: u64,
    ) -> u32 {
        let e = self.alloc(tslot, node, stamp);
        link_after(&mut self.entries, &mut self.ends, GLOBAL, e, global);
        link_after(&mut self.entries, &mut list.ends, TENANT, e, tenant);
        e
    }

    /// The last entry of the run that starts at `e` on the global list: entries of `e`'s
    /// stamp on nodes for which `on` holds.
    pub(crate) fn run_end(&self, e: u32, on: impl Fn(u32) -> bool) -> u32 {
        let stamp = self.entries[e as usize].stamp;
        let mut end = e;
        loop {
            let next = self.entries[end as usize].next[GLOBAL];
            if next == NIL {
                return end;
            }
            let n = &self.entries[next as usize];
            if n.stamp != stamp || !on(n.node) {
                return end;
            }
            end = next;
        }
    }

    pub(crate) fn move_to_back(&mut self, list: &mut TenantList, e: u32, stamp: u64) {
        self.entries[e as usize].stamp = stamp;
        for (ends, w) in [(&mut self.ends, GLOBAL), (&mut list.ends, TENANT)] {
            if ends.tail != e {
                unlink(&mut self.entries, ends, w, e);
                let tail = ends.tail;
                link_after(&mut self.entries, ends, w, e, tail);
            }
        }
    }

    pub(crate) fn remove(&mut self, list: &mut TenantList, e: u32) {
        unlink(&mut self.entries, &mut self.ends, GLOBAL, e);
        unlink(&mut self.entries, &mut list.ends, TENANT, e);
        self.free.push(e);
    }

    fn alloc(&mut self, tslot: u32, node: u32, stamp: u64) -> u32 {
        let entry = Entry {
            tslot,
            node,
            stamp,
            prev: [NIL; 2],
            next: [NIL; 2],
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
}

fn unlink(entries: &mut [Entry], ends: &mut Ends, w: usize, e: u32) {
    let (prev, next) = (entries[e as usize].prev[w], entries[e as usize].next[w]);
    match prev {
        NIL => ends.head = next,
        p => entries[p as usize].next[w] = next,
    }
    match next {
        NIL => ends.tail = prev,
        n => entries[n as usize].prev[w] = prev,
    }
}

/// Links `e` after `after`, or at the front when `after` is NIL.
fn link_after(entries: &mut [Entry], ends: &mut Ends, w: usize, e: u32, after: u32) {
    let next = match after {
        NIL => ends.head,
        a => entries[a as usize].next[w],
    };
    entries[e as usize].prev[w] = after;
    entries[e as usize].next[w] = next;
    match after {
        NIL => ends.head = e,
        a => entries[a as usize].next[w] = e,
    }
    match next {
        NIL => ends.tail = e,
        n => entries[n as usize].prev[w] = e,
    }
}
