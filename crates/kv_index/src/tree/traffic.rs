//! Decayed lookup counts per node: how much recent traffic entered each prefix.

/// Lookups that entered a node, and those of them that ended inside its edge, as counts
/// that halve every `traffic_half_life` lookups; stored with the lookup number they were
/// last brought up to, so a lookup updates only the nodes it passes.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Traffic {
    entered: f32,
    ended: f32,
    at: u32,
}

impl Traffic {
    fn factor(self, now: u32, half_life: u32) -> f32 {
        // Wrapping: a node untouched for 2^32 lookups would read as young; its counts have
        // long been negligible by then anyway.
        let age = now.wrapping_sub(self.at);
        if age == 0 {
            1.0
        } else {
            (-(age as f32) / half_life.max(1) as f32).exp2()
        }
    }

    pub(crate) fn entered_at(self, now: u32, half_life: u32) -> f32 {
        self.entered * self.factor(now, half_life)
    }

    pub(super) fn bump(&mut self, now: u32, half_life: u32, ended_inside: bool) {
        let f = self.factor(now, half_life);
        *self = Traffic {
            entered: self.entered * f + 1.0,
            ended: self.ended * f + if ended_inside { 1.0 } else { 0.0 },
            at: now,
        };
    }

    /// Cuts the counts at a split: every lookup that entered the edge entered its head;
    /// those that ended inside it are taken to have ended inside the head. Returns (head,
    /// tail).
    pub(super) fn split(self) -> (Traffic, Traffic) {
        let tail = Traffic {
            entered: (self.entered - self.ended).max(0.0),
            ended: 0.0,
            at: self.at,
        };
        (self, tail)
    }
}
