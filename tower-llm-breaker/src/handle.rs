use std::sync::Arc;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Meter, ObservableGauge};

use crate::{BreakerKey, BreakerStore, CircuitSnapshot, Observer};

/// Manual control and visibility of a breaker layer's circuits.
///
/// Cheap to clone; shares the layer's store.
#[derive(Clone)]
pub struct BreakerHandle {
    pub(crate) store: Arc<dyn BreakerStore>,
    pub(crate) observer: Option<Observer>,
}

impl std::fmt::Debug for BreakerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BreakerHandle")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

impl BreakerHandle {
    /// Every circuit's state, for a health endpoint.
    pub fn snapshot(&self) -> Vec<CircuitSnapshot> {
        self.store.circuits().iter().map(|c| c.snapshot()).collect()
    }

    /// The state of one circuit, if it exists.
    pub fn get(&self, key: &BreakerKey) -> Option<CircuitSnapshot> {
        self.store.find(key).map(|c| c.snapshot())
    }

    /// Opens `key` by hand (isolates it) until [`close`](Self::close).
    /// Returns `false` if the store is full of busy circuits and could not
    /// keep this one (nothing was isolated).
    pub fn isolate(&self, key: &BreakerKey) -> bool {
        let circuit = self.store.circuit(key.clone());
        if self.store.find(key).is_none() {
            return false;
        }
        let t = circuit.isolate();
        self.notify(t);
        true
    }

    /// Ends `key`'s cooldown now, if it is open: the next call is a
    /// half-open probe (for example, right after an outage is fixed).
    pub fn probe_now(&self, key: &BreakerKey) {
        if let Some(c) = self.store.find(key) {
            c.probe_now();
        }
    }

    /// Closes `key` by hand and forgets its counts (force-close / reset).
    pub fn close(&self, key: &BreakerKey) {
        if let Some(c) = self.store.find(key) {
            let t = c.close();
            self.notify(t);
        }
    }

    /// Closes every circuit by hand.
    pub fn close_all(&self) {
        for c in self.store.circuits() {
            let t = c.close();
            self.notify(t);
        }
    }

    /// Registers the `llm_circuit_state{provider,model}` gauge on `meter`
    /// (0 closed, 1 open, 2 half-open; circuits keyed with a scope, such as
    /// per-authority keys, add a `scope` label), observed from this handle's
    /// circuits at each collection. Register once per breaker store; keep
    /// the returned instrument for as long as the gauge should report.
    ///
    /// ```
    /// use tower_llm_breaker::BreakerLayer;
    ///
    /// let breaker = BreakerLayer::new();
    /// let meter = opentelemetry::global::meter("tower-llm");
    /// let _gauge = breaker.handle().register_gauge(&meter);
    /// ```
    pub fn register_gauge(&self, meter: &Meter) -> ObservableGauge<i64> {
        let handle = self.clone();
        meter
            .i64_observable_gauge("llm_circuit_state")
            .with_description("Circuit breaker state: 0 closed, 1 open, 2 half-open")
            .with_callback(move |observer| {
                for circuit in handle.snapshot() {
                    let provider = KeyValue::new("provider", circuit.key.provider_arc().clone());
                    let model = KeyValue::new("model", circuit.key.model_arc().clone());
                    match circuit.key.scope() {
                        // Per-authority circuits keep one series each.
                        Some(scope) => observer.observe(
                            circuit.state.as_gauge(),
                            &[provider, model, KeyValue::new("scope", scope.to_owned())],
                        ),
                        None => observer.observe(circuit.state.as_gauge(), &[provider, model]),
                    }
                }
            })
            .build()
    }

    fn notify(&self, t: Option<crate::Transition>) {
        crate::layer::announce(self.observer.as_ref(), t.as_ref());
    }
}
