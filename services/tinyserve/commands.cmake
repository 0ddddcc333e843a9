# Serving subcommands (worker, router, serve) and the gRPC client of `generate --server`,
# included by services/tinyserve/CMakeLists.txt after the tinyserve and ts_cli targets exist.
target_sources(tinyserve PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/cmd_client.cc
  ${CMAKE_CURRENT_LIST_DIR}/cmd_router.cc
  ${CMAKE_CURRENT_LIST_DIR}/cmd_serve.cc
  ${CMAKE_CURRENT_LIST_DIR}/cmd_worker.cc
  ${CMAKE_CURRENT_LIST_DIR}/server_flags.cc
)
target_link_libraries(tinyserve PRIVATE ts_worker_server ts_router ts_rpc_common ts_proto
                      ts_tp ts_tp_follower)
target_compile_definitions(tinyserve PRIVATE TINYSERVE_HAVE_SERVER_COMMANDS)
# cmd_generate.cc (in ts_cli) calls RunGenerateClient, defined in cmd_client.cc.
target_compile_definitions(ts_cli PRIVATE TINYSERVE_HAVE_CLIENT)
