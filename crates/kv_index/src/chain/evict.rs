//! Eviction under the cap: leaf holdings on one list, oldest chain end first, and a parent
//! left without held children put at the front so a cold chain goes before a live one.

use super::ChainIndex;
use crate::lru::NIL;
use crate::tree::TenantId;

impl<T: TenantId> ChainIndex<T> {
    /// Drops leaf holdings from the list's head until the blocks held fit the cap; returns
    /// how many.
    pub(super) fn enforce_cap(&mut self) -> usize {
        let Some(max) = self.config.max_blocks else {
            return 0;
        };
        let mut evicted = 0;
        while self.holdings.len() - self.free_holdings.len() > max && self.head != NIL {
            let h = self.head;
            self.drop_leaf(h);
            evicted += 1;
        }
        self.stats.evicted += evicted as u64;
        evicted
    }

    /// Puts `h` at the list's tail: the last to evict.
    pub(super) fn link_back(&mut self, h: u32) {
        let t = self.tail;
        let hd = &mut self.holdings[h as usize];
        (hd.prev, hd.next) = (t, NIL);
        match t {
            NIL => self.head = h,
            t => self.holdings[t as usize].next = h,
        }
        self.tail = h;
    }

    /// Puts `h` at the list's head: the next to evict.
    pub(super) fn link_front(&mut self, h: u32) {
        let f = self.head;
        let hd = &mut self.holdings[h as usize];
        (hd.prev, hd.next) = (NIL, f);
        match f {
            NIL => self.tail = h,
            f => self.holdings[f as usize].prev = h,
        }
        self.head = h;
    }

    /// Takes `h` off the leaf list (a no-op when it is not on it).
    pub(super) fn unlink(&mut self, h: u32) {
        let (prev, next) = {
            let hd = &self.holdings[h as usize];
            (hd.prev, hd.next)
        };
        if prev == NIL && self.head != h {
            return;
        }
        match prev {
            NIL => self.head = next,
            p => self.holdings[p as usize].next = next,
        }
        match next {
            NIL => self.tail = prev,
            n => self.holdings[n as usize].prev = prev,
        }
        let hd = &mut self.holdings[h as usize];
        (hd.prev, hd.next) = (NIL, NIL);
    }
}
