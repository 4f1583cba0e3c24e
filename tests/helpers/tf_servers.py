"""Two real TensorFlow tasks: worker-1 runs a gRPC server; worker-0 joins the cluster (starting its
own server), runs an op on worker-1 and prints ANSWERED with the result. Both stay up until the
file argv[1] exists, then exit 0."""

import json
import os
import sys
import time

import tensorflow as tf

config = json.loads(os.environ["TF_CONFIG"])
cluster = tf.train.ClusterSpec(config["cluster"])
if config["task"]["index"] == 0:
    tf.config.experimental_connect_to_cluster(cluster, job_name="worker", task_index=0)
    with tf.device("/job:worker/replica:0/task:1/device:CPU:0"):
        value = tf.constant(20) + tf.constant(22)
    print("ANSWERED", int(value.numpy()), flush=True)
else:
    server = tf.distribute.Server(cluster, job_name="worker", task_index=1, start=True)
    print("SERVING", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.2)
sys.stdout.flush()
os._exit(0)  # a remote eager context may hold the interpreter's exit; the test has read what it needs
