"""TensorFlow's parameter-server tutorial (`tutorials/distribute/
parameter_server_training`), run by the chief of a `multi_worker.LocalCluster`
under `tf.distribute` ("tf") or `tf_distribute_lite`: its code as written,
with `tf.distribute` replaced by the module under test and `tf.keras` by
tf_keras, and fewer steps. Seeds are set first, so that both modules see the
same data; what the tutorial prints, and what it leaves on disk, is returned
as facts for the tests to compare.
"""

import os
import random

import numpy as np
import tensorflow as tf
import tf_keras

import ps_scenarios


def tutorial(context):
  random.seed(1)
  tf.random.set_seed(1)
  mod = context.mod
  facts = {}

  # --- Instantiate a ParameterServerStrategy.
  NUM_PS = 2  # pylint: disable=invalid-name
  variable_partitioner = (
      mod.experimental.partitioners.MinSizePartitioner(
          min_shard_bytes=(256 << 10),
          max_shards=NUM_PS))
  strategy = ps_scenarios.parameter_server_strategy(context, variable_partitioner)

  # --- Training with Model.fit.
  def dataset_fn(input_context):
    global_batch_size = 64
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)

    x = tf.random.uniform((10, 10))
    y = tf.random.uniform((10,))

    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(10).repeat()
    dataset = dataset.shard(
        input_context.num_input_pipelines,
        input_context.input_pipeline_id)
    dataset = dataset.batch(batch_size)
    dataset = dataset.prefetch(2)

    return dataset

  dc = tf_keras.utils.experimental.DatasetCreator(dataset_fn)

  with strategy.scope():
    model = tf_keras.models.Sequential([tf_keras.layers.Dense(10)])

    model.compile(tf_keras.optimizers.legacy.SGD(), loss="mse", steps_per_execution=10)

  working_dir = os.path.join(context.directory, "my_working_dir")
  log_dir = os.path.join(working_dir, "log")
  ckpt_filepath = os.path.join(working_dir, "ckpt")
  backup_dir = os.path.join(working_dir, "backup")

  callbacks = [
      tf_keras.callbacks.TensorBoard(log_dir=log_dir),
      tf_keras.callbacks.ModelCheckpoint(filepath=ckpt_filepath),
      tf_keras.callbacks.BackupAndRestore(backup_dir=backup_dir),
  ]

  history = model.fit(dc, epochs=2, steps_per_epoch=10, callbacks=callbacks, verbose=0)
  facts["fit"] = {
      "history": history.history,
      "iterations": int(model.optimizer.iterations.numpy()),
      "weights": [np.asarray(w).tolist() for w in model.get_weights()],
      "working_dir": sorted(os.listdir(working_dir)),
      "backup": sorted(os.listdir(backup_dir)),
      "saved_model": sorted(os.listdir(ckpt_filepath)),
      "tensorboard": sorted(os.listdir(log_dir)),
  }

  # --- Training with a custom training loop: the data.
  feature_vocab = [
      "avenger", "ironman", "batman", "hulk", "spiderman", "kingkong", "wonder_woman"
  ]
  label_vocab = ["yes", "no"]

  with strategy.scope():
    feature_lookup_layer = tf_keras.layers.StringLookup(
        vocabulary=feature_vocab,
        mask_token=None)
    label_lookup_layer = tf_keras.layers.StringLookup(
        vocabulary=label_vocab,
        num_oov_indices=0,
        mask_token=None)

    raw_feature_input = tf_keras.layers.Input(
        shape=(3,),
        dtype=tf.string,
        name="feature")
    feature_id_input = feature_lookup_layer(raw_feature_input)
    feature_preprocess_stage = tf_keras.Model(
        {"features": raw_feature_input},
        feature_id_input)

    raw_label_input = tf_keras.layers.Input(
        shape=(1,),
        dtype=tf.string,
        name="label")
    label_id_input = label_lookup_layer(raw_label_input)

    label_preprocess_stage = tf_keras.Model(
        {"label": raw_label_input},
        label_id_input)

  def feature_and_label_gen(num_examples=200):
    examples = {"features": [], "label": []}
    for _ in range(num_examples):
      features = random.sample(feature_vocab, 3)
      label = ["yes"] if "avenger" in features else ["no"]
      examples["features"].append(features)
      examples["label"].append(label)
    return examples

  examples = feature_and_label_gen()

  def dataset_fn(_):  # pylint: disable=function-redefined
    raw_dataset = tf.data.Dataset.from_tensor_slices(examples)

    train_dataset = raw_dataset.map(
        lambda x: (
            {"features": feature_preprocess_stage(x["features"])},
            label_preprocess_stage(x["label"])
        )).shuffle(200).batch(32).repeat()
    return train_dataset

  # --- The model, its optimizer and metric.
  with strategy.scope():
    model_input = tf_keras.layers.Input(
        shape=(3,), dtype=tf.int64, name="model_input")

    emb_layer = tf_keras.layers.Embedding(
        input_dim=len(feature_lookup_layer.get_vocabulary()), output_dim=16384)
    emb_output = tf.reduce_mean(emb_layer(model_input), axis=1)
    dense_output = tf_keras.layers.Dense(units=1, activation="sigmoid")(emb_output)
    model = tf_keras.Model({"features": model_input}, dense_output)

    optimizer = tf_keras.optimizers.legacy.RMSprop(learning_rate=0.1)
    accuracy = tf_keras.metrics.Accuracy()

  assert len(emb_layer.weights) == 2
  assert emb_layer.weights[0].shape == (4, 16384)
  assert emb_layer.weights[1].shape == (4, 16384)
  # The tutorial asserts ps 0 and 1, on its own path; after Model.fit's
  # variables, the round robin may start on either.
  facts["embedding_devices"] = [w.device for w in emb_layer.weights]

  @tf.function
  def step_fn(iterator):

    def replica_fn(batch_data, labels):
      with tf.GradientTape() as tape:
        pred = model(batch_data, training=True)
        per_example_loss = tf_keras.losses.BinaryCrossentropy(
            reduction=tf_keras.losses.Reduction.NONE)(labels, pred)
        loss = tf.nn.compute_average_loss(per_example_loss)
        gradients = tape.gradient(loss, model.trainable_variables)

      optimizer.apply_gradients(zip(gradients, model.trainable_variables))

      actual_pred = tf.cast(tf.greater(pred, 0.5), tf.int64)
      accuracy.update_state(labels, actual_pred)
      return loss

    batch_data, labels = next(iterator)
    losses = strategy.run(replica_fn, args=(batch_data, labels))
    return strategy.reduce(mod.ReduceOp.SUM, losses, axis=None)

  # --- Dispatch training steps to remote workers.
  coordinator = mod.experimental.coordinator.ClusterCoordinator(strategy)

  @tf.function
  def per_worker_dataset_fn():
    return strategy.distribute_datasets_from_function(dataset_fn)

  per_worker_dataset = coordinator.create_per_worker_dataset(per_worker_dataset_fn)
  per_worker_iterator = iter(per_worker_dataset)

  # The loop of "Handling task failure": a checkpoint at each epoch's end.
  num_epoches = 3
  steps_per_epoch = 4
  checkpoint_dir = os.path.join(context.directory, "checkpoints")
  checkpoint_manager = tf.train.CheckpointManager(
      tf.train.Checkpoint(model=model, optimizer=optimizer),
      checkpoint_dir,
      max_to_keep=3)
  if checkpoint_manager.latest_checkpoint:
    checkpoint = checkpoint_manager.checkpoint
    checkpoint.restore(
        checkpoint_manager.latest_checkpoint).assert_existing_objects_matched()

  global_steps = int(optimizer.iterations.numpy())
  starting_epoch = global_steps // steps_per_epoch

  facts["epoch_accuracy"] = []
  for _ in range(starting_epoch, num_epoches):
    accuracy.reset_states()
    for _ in range(steps_per_epoch):
      coordinator.schedule(step_fn, args=(per_worker_iterator,))
    coordinator.join()
    facts["epoch_accuracy"].append(float(accuracy.result().numpy()))
    checkpoint_manager.save()

  rms = optimizer.get_slot(emb_layer.embeddings, "rms")
  facts["saved"] = {  # what the last checkpoint holds
      "embeddings": tf.convert_to_tensor(emb_layer.embeddings).numpy(),
      "rms": tf.convert_to_tensor(rms).numpy(),
      "iterations": int(optimizer.iterations.numpy()),
  }
  facts["rms"] = [type(rms).__name__, [s.shape.as_list() for s in rms.variables],
                  [s.device for s in rms.variables]]

  loss = coordinator.schedule(step_fn, args=(per_worker_iterator,))
  facts["final_loss"] = float(loss.fetch())
  facts["done_after_fetch"] = coordinator.done()

  # --- Evaluation from the last checkpoint: inline, direct then distributed.
  checkpoint_manager.checkpoint.restore(
      checkpoint_manager.latest_checkpoint).assert_existing_objects_matched()
  facts["restored_iterations"] = int(optimizer.iterations.numpy())
  facts["restored_rms_matches"] = bool(np.array_equal(
      tf.convert_to_tensor(optimizer.get_slot(emb_layer.embeddings, "rms")).numpy(),
      facts["saved"]["rms"]))
  eval_examples = feature_and_label_gen(num_examples=16)

  eval_dataset = tf.data.Dataset.from_tensor_slices(
      eval_examples).map(
          lambda x: (
              {"features": feature_preprocess_stage(x["features"])},
              label_preprocess_stage(x["label"])
          )).batch(8)

  eval_accuracy = tf_keras.metrics.Accuracy()

  for batch_data, labels in eval_dataset:
    pred = model(batch_data, training=False)
    actual_pred = tf.cast(tf.greater(pred, 0.5), tf.int64)
    eval_accuracy.update_state(labels, actual_pred)

  facts["direct_eval_accuracy"] = float(eval_accuracy.result())

  with strategy.scope():
    # Define the eval metric on parameter servers.
    eval_accuracy = tf_keras.metrics.Accuracy()

  @tf.function
  def eval_step(iterator):
    def replica_fn(batch_data, labels):
      pred = model(batch_data, training=False)
      actual_pred = tf.cast(tf.greater(pred, 0.5), tf.int64)
      eval_accuracy.update_state(labels, actual_pred)
    batch_data, labels = next(iterator)
    strategy.run(replica_fn, args=(batch_data, labels))

  def eval_dataset_fn():
    return tf.data.Dataset.from_tensor_slices(
        eval_examples).map(
            lambda x: (
                {"features": feature_preprocess_stage(x["features"])},
                label_preprocess_stage(x["label"])
            )).shuffle(16).repeat().batch(8)

  per_worker_eval_dataset = coordinator.create_per_worker_dataset(eval_dataset_fn)
  per_worker_eval_iterator = iter(per_worker_eval_dataset)

  eval_steps_per_epoch = 2
  for _ in range(eval_steps_per_epoch):
    coordinator.schedule(eval_step, args=(per_worker_eval_iterator,))
  coordinator.join()
  facts["distributed_eval_accuracy"] = float(eval_accuracy.result())

  # --- Side-car evaluation: a model outside the strategy reads the
  # checkpoints as they come.
  eval_model_input = tf_keras.layers.Input(shape=(3,), dtype=tf.int64, name="model_input")
  eval_output = tf_keras.layers.Dense(units=1, activation="sigmoid")(tf.reduce_mean(
      tf_keras.layers.Embedding(input_dim=8, output_dim=16384)(eval_model_input), axis=1))
  eval_model = tf_keras.Model({"features": eval_model_input}, eval_output)
  eval_model.compile(loss=tf_keras.losses.BinaryCrossentropy(),
                     metrics=[tf_keras.metrics.BinaryAccuracy()])
  eval_data = [(batch_data, labels) for batch_data, labels in eval_dataset]
  eval_data = tf.data.Dataset.from_tensor_slices((
      {"features": tf.concat([b["features"] for b, _ in eval_data], 0)},
      tf.concat([tf.cast(label, tf.float32) for _, label in eval_data], 0))).batch(8)
  checkpoint = tf.train.Checkpoint(model=eval_model)
  train_epoches = num_epoches

  facts["side_car"] = []
  for latest_checkpoint in tf.train.checkpoints_iterator(checkpoint_dir, timeout=60):
    try:
      checkpoint.restore(latest_checkpoint).expect_partial()
    except (tf.errors.OpError,) as e:  # pylint: disable=unused-variable
      # checkpoint may be deleted by training when it is about to read it.
      continue

    facts["side_car"].append([os.path.basename(latest_checkpoint),
                              eval_model.evaluate(eval_data, verbose=0, return_dict=True)])

    # Evaluation finishes when it has evaluated the last epoch.
    if latest_checkpoint.endswith("-{}".format(train_epoches)):
      break
  facts["side_car_embeddings_match"] = bool(np.array_equal(
      eval_model.get_weights()[0], facts["saved"]["embeddings"]))

  # --- What the last checkpoint holds.
  path = checkpoint_manager.latest_checkpoint
  reader = tf.train.load_checkpoint(path)
  keys = dict(tf.train.list_variables(path))
  embeddings = "model/layer_with_weights-0/embeddings/.ATTRIBUTES/VARIABLE_VALUE"
  slot = "model/layer_with_weights-0/embeddings/.OPTIMIZER_SLOT/optimizer/rms/.ATTRIBUTES/VARIABLE_VALUE"
  facts["checkpoint"] = {
      "keys": sorted((k, v) for k, v in keys.items() if k != "_CHECKPOINTABLE_OBJECT_GRAPH"),
      "embeddings_match": bool(np.array_equal(reader.get_tensor(embeddings),
                                              facts["saved"]["embeddings"])),
      "rms_match": bool(np.array_equal(reader.get_tensor(slot), facts["saved"]["rms"])),
      "iterations": int(reader.get_tensor("optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE")),
  }
  facts["saved"] = {k: np.asarray(v).tolist() for k, v in facts["saved"].items()}
  return facts
