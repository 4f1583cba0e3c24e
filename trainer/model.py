"""The seeds' CNN and its optimizer (tf_keras, or Keras 3: see trainer.kerasapi).

Conv2D, then blocks of two selu SeparableConv2D layers and a MaxPool with the
filter count doubling each block, Flatten, Dense(512, selu), Dense(10, softmax).
--width scales the filter counts. Layers use padding='same', and only as many
pooling blocks are built as the input's spatial size allows (2 for 8x8 digits,
3 for 28x28 mnist). Build both inside strategy.scope().
"""

from __future__ import annotations

from trainer.kerasapi import keras

BASE_FILTERS = 64
MAX_BLOCKS = 3
DENSE_UNITS = 512


def pooling_blocks(height: int, width: int, max_blocks: int = MAX_BLOCKS) -> int:
    """How many 2x2 poolings fit while the feature map stays at least 2x2."""
    blocks, size = 0, min(height, width)
    while blocks < max_blocks and size // 2 >= 2:
        size //= 2
        blocks += 1
    return blocks


def scaled(filters: int, width: float) -> int:
    return max(4, int(round(filters * width)))


def build_model(input_shape: tuple[int, ...], width: float, num_classes: int = 10) -> keras.Model:
    # lecun_normal is the initializer selu's self-normalisation assumes.
    init = "lecun_normal"
    layers = [
        keras.layers.Input(shape=input_shape),
        keras.layers.Conv2D(scaled(BASE_FILTERS, width), 3, padding="same", activation="selu",
                            kernel_initializer=init),
    ]
    filters = BASE_FILTERS * 2
    for _ in range(pooling_blocks(input_shape[0], input_shape[1])):
        for _ in range(2):
            layers.append(keras.layers.SeparableConv2D(
                scaled(filters, width), 3, padding="same", activation="selu",
                depthwise_initializer=init, pointwise_initializer=init))
        layers.append(keras.layers.MaxPool2D(2))
        filters *= 2
    layers += [
        keras.layers.Flatten(),
        keras.layers.Dense(DENSE_UNITS, activation="selu", kernel_initializer=init),
        keras.layers.Dense(num_classes, activation="softmax"),
    ]
    return keras.Sequential(layers, name="seeds_cnn")


def build_optimizer(name: str, lr: float) -> keras.optimizers.Optimizer:
    if name == "adam":
        return keras.optimizers.Adam(learning_rate=lr)
    if name == "sgd":
        return keras.optimizers.SGD(learning_rate=lr, momentum=0.9)
    raise ValueError(f"unknown optimizer {name!r}")
