// Umbrella header: the whole public API of rdmx.
#pragma once

#include <rdmx/config.hpp>
#include <rdmx/connection.hpp>
#include <rdmx/endpoint.hpp>
#include <rdmx/error.hpp>
#include <rdmx/log.hpp>
#include <rdmx/memory.hpp>
#include <rdmx/queues.hpp>
#include <rdmx/uri.hpp>
