"""One module per engine: ``graph`` (TF1-style sessions), ``keras2`` (tf.keras / tf_keras eager), ``keras3``."""
