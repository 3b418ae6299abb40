//! A burn-train renderer that shows nothing, and the one Learner setup of the tests and
//! benches ([`quiet_training!`](crate::quiet_training)).

use burn::train::renderer::{
    EvaluationName, EvaluationProgress, MetricState, MetricsRenderer, MetricsRendererEvaluation,
    MetricsRendererTraining, ProgressType, TrainingProgress,
};

/// A renderer that shows nothing.
pub struct Silent;

impl MetricsRendererTraining for Silent {
    fn update_train(&mut self, _state: MetricState) {}
    fn update_valid(&mut self, _state: MetricState) {}
    fn render_train(&mut self, _item: TrainingProgress, _progress: Vec<ProgressType>) {}
    fn render_valid(&mut self, _item: TrainingProgress, _progress: Vec<ProgressType>) {}
}

impl MetricsRendererEvaluation for Silent {
    fn update_test(&mut self, _name: EvaluationName, _state: MetricState) {}
    fn render_test(&mut self, _item: EvaluationProgress, _progress: Vec<ProgressType>) {}
}

impl MetricsRenderer for Silent {
    fn manual_close(&mut self) {}
    fn register_metric(&mut self, _definition: burn::train::metric::MetricDefinition) {}
}

/// burn-train's `SupervisedTraining` over the data loaders `$train` and `$valid` for `$epochs`
/// epochs, its logs in the folder `$dir`, without the application log and showing nothing
/// (the [`Silent`] renderer): the Learner setup every test and bench shares. Add metrics,
/// then `launch`. A macro, as the builder's type follows the loaders'.
#[macro_export]
macro_rules! quiet_training {
    ($dir:expr, $train:expr, $valid:expr, $epochs:expr) => {
        burn::train::SupervisedTraining::new($dir, $train, $valid)
            .with_application_logger(None)
            .renderer($crate::Silent)
            .num_epochs($epochs)
    };
}
