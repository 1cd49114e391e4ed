"""The three example jobs published with OpenPAI (``microsoft/pai``), as YAML text.

Their content is kept (long descriptions shortened, a few commands dropped), including what
only the rest-server's schema accepts: ``version: 1.0`` as a number in ``tensorflow_cifar10``.
``CPU_500Task_MNIST`` has 501 tasks, so submit it to an emulator with a lag and stop it.
"""

HELLO_WORLD = """
protocolVersion: 2
name: hello-world-job
type: job
jobRetryCount: 0
prerequisites:
  - type: dockerimage
    uri: 'openpai/standard:python_3.6-tensorflow_1.15.0-gpu'
    name: docker_image_0
taskRoles:
  taskrole:
    instances: 1
    completion:
      minFailedInstances: 1
      minSucceededInstances: -1
    taskRetryCount: 0
    dockerImage: docker_image_0
    resourcePerInstance:
      gpu: 1
      cpu: 1
      memoryMB: 6500
    commands:
      - 'git clone https://github.com/tensorflow/models'
      - cd models
      - git reset --hard 62bf6fc0bb2b41a4fb851909c132647a7e0774b0
      - cd research/slim
      - >-
        python download_and_convert_data.py --dataset_name=cifar10
        --dataset_dir=/tmp/data
      - >-
        python train_image_classifier.py --dataset_name=cifar10
        --dataset_dir=/tmp/data --max_number_of_steps=1000
defaults:
  virtualCluster: default
extras:
  com.microsoft.pai.runtimeplugin:
    - plugin: ssh
      parameters:
        jobssh: true
"""

CPU_500_TASK_MNIST = """
protocolVersion: 2
name: CPU_500Task_MNIST
type: job
jobRetryCount: 0
prerequisites:
  - type: dockerimage
    uri: 'openpai/standard:python_3.6-pytorch_1.4.0-cpu'
    name: docker_image_0
taskRoles:
  master:
    instances: 1
    completion:
      minFailedInstances: 1
    taskRetryCount: 0
    dockerImage: docker_image_0
    resourcePerInstance:
      gpu: 0
      cpu: 1
      memoryMB: 50000
    commands:
      - >-
        wget
        https://raw.githubusercontent.com/microsoft/pai/master/examples/mnist_500_tasks/src/get_results.py
      - >-
        python get_results.py --number=500 --data_path
        /mnt/confignfs/mnist500_result/
      - jupyter notebook
  taskrole:
    instances: 500
    completion:
      minFailedInstances: 1
      minSucceededInstances: -1
    taskRetryCount: 0
    dockerImage: docker_image_0
    resourcePerInstance:
      gpu: 0
      cpu: 1
      memoryMB: 50000
    commands:
      - >-
        python mnist_lr_500.py --epoch 5
        --task_index=$PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX
      - 'mount -t nfs4 10.151.40.235:/data data'
defaults:
  virtualCluster: default
extras:
  gangAllocation: false
  com.microsoft.pai.runtimeplugin:
    - plugin: ssh
      parameters:
        jobssh: true
    - plugin: teamwise_storage
      parameters:
        storageConfigNames:
          - confignfs
"""

TENSORFLOW_CIFAR10 = """
protocolVersion: 2
name: tensorflow_cifar10
type: job
version: 1.0
contributor: OpenPAI
description: |
  # TensorFlow Distributed Training
  This example runs TensorFlow Distributed Training on OpenPAI using CIFAR10.

parameters:
  model: resnet20
  batchsize: 32

prerequisites:
  - protocolVersion: 2
    name: tf_example
    type: dockerimage
    version: 1.0-r1.4
    contributor: OpenPAI
    description: |
      This is an example TensorFlow Docker image on OpenPAI.
    uri: openpai/pai.example.tensorflow
  - protocolVersion: 2
    name: tensorflow_cifar10_model
    type: output
    version: 1.0
    contributor: OpenPAI
    description: |
      Output directory for CIFAR10 training on HDFS, contains pre-trained models.
    uri: hdfs://192.168.0.1:9000/core/cifar10_model
  - protocolVersion: 2
    name: tensorflow_cnnbenchmarks
    type: script
    version: 84820935288cab696c9c2ac409cbd46a1f24723d
    contributor: MaggieQi
    description: |
      # TensorFlow benchmarks
    uri: https://github.com/MaggieQi/benchmarks
  - protocolVersion: 2
    name: cifar10
    type: data
    version: latest
    contributor: OpenPAI
    description: |
      # The CIFAR10 dataset
    uri:
      - https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz

taskRoles:
  worker:
    instances: 1
    completion:
      minSucceededInstances: 1
    dockerImage: tf_example
    data: cifar10
    output: tensorflow_cifar10_model
    script: tensorflow_cnnbenchmarks
    resourcePerInstance:
      cpu: 2
      memoryMB: 16384
      gpu: 4
    commands:
      - cd script_<% $script.name %>/scripts/tf_cnn_benchmarks
      - >
        python tf_cnn_benchmarks.py --job_name=worker
        --ps_hosts=$PAI_TASK_ROLE_psserver_HOST_LIST
        --worker_hosts=$PAI_TASK_ROLE_worker_HOST_LIST
        --data_name=<% $data.name %>
        --data_dir=$PAI_WORK_DIR/data_<% $data.name %>
        --train_dir=$PAI_WORK_DIR/output_<% $output.name %>
        --model=<% $parameters.model %>
        --batch_size=<% $parameters.batchsize %>
  psserver:
    instances: 1
    completion:
      minSucceededInstances: 1
    dockerImage: tf_example
    data: cifar10
    output: tensorflow_cifar10_model
    script: tensorflow_cnnbenchmarks
    resourcePerInstance:
      cpu: 2
      memoryMB: 16384
      gpu: 1
    commands:
      - cd script_<% $script.name %>/scripts/tf_cnn_benchmarks
      - >
        python tf_cnn_benchmarks.py --job_name=ps
        --model=<% $parameters.model %>
        --batch_size=<% $parameters.batchsize %>

deployments:
  - name: tf_example
    taskRoles:
      worker:
        preCommands:
          - wget -qO- <% $data.uri[0] %> | tar xvz && mv cifar-10-batches-py data_<% $data.name %>
          - >
            git clone <% $script.uri %> script_<% $script.name %> &&
            cd script_<% $script.name %> && git checkout <% $script.version %> && cd ..
      psserver:
        preCommands:
          - wget -qO- <% $data.uri[0] %> | tar xvz && mv cifar-10-batches-py data_<% $data.name %>
        postCommands:
          - echo "Uploading data ..." # && hdfs dfs -cp output_<% $output.name %> <% $output.uri %>

defaults:
  deployment: tf_example
"""
